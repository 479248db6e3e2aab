# TEMPORARY (removed in this same change): old import path kept while another engineer's tests still use it.
from seedlocal.networks import *  # noqa: F401,F403
from seedlocal.policies import RandomPolicy  # noqa: F401
