"""``pgfence demo``: the double run, without and with pgfence's protections
(the story: :mod:`.story`; its acts: :mod:`.acts`; the processes it runs:
:mod:`.cast`; its statements: :mod:`.store` and ``demo.sql``)."""

from pgfence.tools.demo.story import check_options, run

__all__ = ["check_options", "run"]
