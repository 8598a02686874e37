"""dynexport: export PyTorch models to ONNX through a graph-capture compiler.

>>> onnx_program = dynexport.export(model, (x,), "model.onnx", dynamic_shapes=({0: Dim("batch")},))
"""

from dynexport import errors
from dynexport.api import (
    DEFAULT_OPSET,
    SUPPORTED_OPSETS,
    export,
    export_to_pretty_string,
    verify,
)
from dynexport.backend import backend
from dynexport.modes import (
    TrainingMode,
    is_in_onnx_export,
    select_model_mode_for_export,
    shape_as_tensor,
)
from dynexport.program import ONNXProgram
from dynexport.registry import (
    Promote,
    TranslationTable,
    register_translation,
    translates,
    unregister_translation,
)
from dynexport.translate import TranslationContext
from dynexport.verification import VerificationReport

__all__ = [
    "DEFAULT_OPSET",
    "ONNXProgram",
    "Promote",
    "SUPPORTED_OPSETS",
    "TranslationContext",
    "TrainingMode",
    "TranslationTable",
    "backend",
    "errors",
    "export",
    "export_to_pretty_string",
    "is_in_onnx_export",
    "register_translation",
    "select_model_mode_for_export",
    "shape_as_tensor",
    "translates",
    "unregister_translation",
    "VerificationReport",
    "verify",
]

__version__ = "0.1.0"
