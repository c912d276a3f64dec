"""For the benchmark's io section only: on PYTHONPATH, makes gc.freeze() a
no-op in every process of one pgfence run, to measure what the arbiter's
freeze before forking saves in the children's USS.  pgfence has no switch
for it, on purpose."""

import gc

gc.freeze = lambda: None
