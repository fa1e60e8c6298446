"""Python side of Pipeforge: the `pipe_split()` marker for scripted models.

Place `pipe_split()` between statements of a module's `forward`; after
`torch.jit.script` + `save`, `pipeforge split` cuts the model there.

    from pipeforge import pipe_split

    def forward(self, x):
        x = self.block0(x)
        pipe_split()
        return self.block1(x)

The op has no inputs or outputs, so TorchScript's dead-code elimination would
drop it; registering it with CONSERVATIVE alias analysis (here and in Pipeforge's
C++ frontend) marks it as having side effects, which keeps it in the graph.
"""
import torch

__all__ = ["pipe_split", "export_on_meta"]

_NAMESPACE = "pipeforge"


def _register() -> None:
    if hasattr(torch.ops, _NAMESPACE) and hasattr(getattr(torch.ops, _NAMESPACE), "pipe_split"):
        try:
            torch.ops.pipeforge.pipe_split  # already registered in this process
            return
        except (AttributeError, RuntimeError):
            pass
    lib = torch.library.Library(_NAMESPACE, "DEF")
    lib.define("pipe_split() -> ()", alias_analysis="CONSERVATIVE")
    # No tensor arguments, so no backend key applies: the impl must be composite.
    lib.impl("pipe_split", lambda: None, "CompositeExplicitAutograd")
    globals()["_LIBRARY"] = lib  # keep the registration alive for the process


_register()


def pipe_split() -> None:
    """Marks a pipeline stage boundary; a no-op when the model runs."""
    torch.ops.pipeforge.pipe_split()


def export_on_meta(*args, **kwargs):
    """See pipeforge.meta_export.export_on_meta."""
    from pipeforge.meta_export import export_on_meta as export

    return export(*args, **kwargs)
