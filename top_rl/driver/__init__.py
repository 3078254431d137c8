"""The driver's side of Ray: which process runs where (placement), the actors, the cluster that starts and stops
them, and where they listen (rendezvous, Ray's single-machine mode)."""
