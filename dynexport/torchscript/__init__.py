"""The TorchScript front end of ``export(..., dynamo=False)``: a TorchScript model as an
ExportedProgram, before any translation.

- :mod:`.convert`: the TorchScript graph to an FX GraphModule that torch.export captures;
- :mod:`.control_flow`: ``prim::Loop`` and ``prim::If`` at capture (unrolled, picked, or
  ``torch.while_loop`` / ``torch.cond``); ``dynexport.ops.control_flow`` translates the latter;
- :mod:`.lists`: lists of run-time length as ``dynexport::sequence_*`` operators on a handle;
  ``dynexport.ops.sequence`` translates them to ONNX sequences;
- :mod:`.retrace`: a traced model traced again at other sizes of its dynamic dims, refused when
  the graph differs (a loop unrolled or a branch taken over a size).
"""

from dynexport.torchscript.convert import capture, graph_module, is_torchscript
from dynexport.torchscript.retrace import check_trace_holds_at_other_sizes

__all__ = ["capture", "check_trace_holds_at_other_sizes", "graph_module", "is_torchscript"]
