"""The gRPC bridge between hosts: another host's env workers step remote groups of the learner's unroll store
(docs/multihost.md; its three files in docs/architecture.md).

It stays inside the pipeline: the pipeline starts the server, and the client runs the pipeline's workers, so a
folder of its own on a floor above or below the pipeline would import it the wrong way round.
"""
