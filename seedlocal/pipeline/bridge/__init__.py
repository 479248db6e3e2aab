"""The gRPC bridge between hosts: another host's env workers step remote
groups of the learner's unroll store (docs/multihost.md).

- ``server.py``: the learner host's end, to the store one more worker; the
  ``ActorPool`` starts it as its own process.
- ``client.py``: the actor host's end (``seedlocal actors``), to its own
  workers the inference loop; it runs an ``ActorPool`` of its own.
- ``wire.py``: what travels between them: one group's step per message as
  raw bytes, and the handshake that proves the shared token.

It stays inside the pipeline: the pipeline starts the server, and the client
runs the pipeline's workers, so a folder of its own on a floor above or below
the pipeline would import it the wrong way round.
"""
