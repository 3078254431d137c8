"""The SGLang engine: one `sglang.launch_server` child process per engine behind the RolloutEngine interface.

  engine.py        SglangEngine: lifecycle, generate and score, the weight protocol's receiving end (top_rl/engine/interface.py)
  weight_state.py  the server's weight state (version, expected version, needs a sync, released, resumed empty, the
                   last disk version) and its named transitions
  config.py        SglangSettings (rollout.sglang), SglangEngineConfig (frozen) and the refusals run before any GPU
  plan.py          from the run config to each engine's resolved config (ports, weights dir, group name) and the dry run
  launch.py        the server command and environment, checked with SGLang's own parser
  server.py        the child process: start, stop, log tail
  client.py        the HTTP client: retries, the admin and weight requests
  protocol.py      request bodies and answers of /generate (sampling, re-scoring)
  rollout.py       a rollout's concurrent calls, its progress and timings
  memory.py        the GPU memory a server beside a trainer needs (cluster.gpu_handoff), checked before start
  disk.py          a weight version as an HF checkpoint the server reloads
"""
