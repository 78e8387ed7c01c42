"""Read-only attributes read through another object: one line where a property only forwarded.

class TargetPieces:
    num_layers = forwarded("config.num_hidden_layers")   # target.num_layers == target.config.num_...
class Wrapper:
    drafter = forwarded("inner.drafter", default=None)    # getattr(self.inner, "drafter", None)
"""

from __future__ import annotations

from operator import attrgetter

_REQUIRED = object()


def forwarded(path: str, default=_REQUIRED) -> property:
    """A read-only property returning `self.<path>` (a dotted path). Without `default`, a missing attribute
    raises AttributeError, as a property returning `self.<path>` would; with one, the last attribute is
    optional (getattr's default; every read returns that one object, so make it immutable). Assigning to
    it raises, as for any property without a setter."""
    if default is _REQUIRED:
        return property(attrgetter(path), doc=f"self.{path}")
    owner, _, name = path.rpartition(".")
    read_owner = attrgetter(owner) if owner else (lambda obj: obj)
    return property(lambda obj: getattr(read_owner(obj), name, default), doc=f"self.{path}, else {default!r}")
