"""Moving the trainer's weights into the engines: buckets, transports, senders and receivers."""
