"""Environment backends, all seen by a worker as one *group*: a batch of environments with ``reset()``,
``send(actions)`` and ``recv()``.

``send`` starts stepping and may return at once (envpool steps in its own threads); ``recv`` waits for the results.
A worker with two groups sends one and then receives the other, which is what keeps its CPU busy while the
inference loop computes the first group's next actions.

Every backend follows envpool's auto-reset convention: the step after an episode ends resets that env, ignores its
action and returns reward 0. The worker marks such rows ``ignored`` in the unroll store.

Observations are always a dict (key ``""`` for a plain array observation). An env worker imports these, and no
torch: nothing here imports it. What each module holds: docs/architecture.md's table of packages.
"""
