"""vLLM v1's KV-cache event protocol, both ways: attach to a vLLM's events, or publish blockviz's.

- protocol.py: the msgspec records (BlockStored, BlockRemoved, AllBlocksCleared, EventBatch), a
  decoder for both wire shapes (tagged arrays up to vLLM 0.23, maps with a "type" key since), and
  an encoder that writes the map shape.
- subscriber.py: a ZMQ SUB client that follows sequence numbers and fills gaps through the replay
  ROUTER, one socket per data-parallel rank.
- state.py: the model layer of `blockviz attach`: what vLLM told us (the hash-chain forest, stores
  and removals over time, cache size and churn per rank, the gaps), and what it does not tell.
- mapping.py and publisher.py: blockviz's engine events as vLLM's, on a vLLM-compatible PUB socket
  with a replay buffer (`blockviz publish`).
- endpoints.py: endpoint checks and the per-rank port offset.

No torch and no textual: a laptop without either can attach. The engine (engine/) never imports
zmq; publishing subscribes to its EventBus from here.
"""
