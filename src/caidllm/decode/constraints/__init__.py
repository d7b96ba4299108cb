"""Structured output held over the whole canvas in any commit order (docs/structured-output.md): the request's
constraint (spec.py), its token automaton (automaton.py, outlines-core), the any-order state sets (canvas.py)
and the engine's hook where logits become tokens (guide.py)."""

from caidllm.decode.constraints.spec import Constraint, constraint_of, per_prompt

__all__ = ["Constraint", "constraint_of", "per_prompt"]
