"""vLLM v1's KV-cache event protocol, both ways: attach to a vLLM's events, or publish blockviz's.

- protocol.py: the msgspec records (BlockStored, BlockRemoved, AllBlocksCleared, EventBatch), the
  wire formats by vLLM release (events as tagged arrays up to 0.23, maps since 0.24; the topic in
  replay answers since 0.26), a bounded decoder for all of them, and an encoder that writes the
  bytes the chosen release writes.
- subscriber.py: a ZMQ SUB client that follows sequence numbers (restarts, bogus numbers and
  jumps shown as such) and fills gaps through the replay ROUTER within a deadline, one socket per
  data-parallel rank.
- state.py: the model layer of `blockviz attach`: what vLLM told us (the hash-chain forest, stores
  and removals over time, cache size and churn per rank, the gaps), and what it does not tell.
- mapping.py and publisher.py: blockviz's engine events as vLLM's, on a vLLM-compatible PUB socket
  with a replay buffer (`blockviz publish`).
- endpoints.py: endpoint checks (IPv6 addresses too), sockets opened on them, and the per-rank
  port offset.

No torch and no textual: a laptop without either can attach. The engine (engine/) never imports
zmq; publishing subscribes to its EventBus from here.
"""
