"""The translation table: one module per operator family, each registering its rules on import."""

from dynexport.ops import (  # noqa: F401
    activation,
    attention,
    control_flow,
    convolution,
    creation,
    elementwise,
    indexing,
    linalg,
    normalization,
    padding,
    pooling,
    quantization,
    random,
    recurrent,
    reduction,
    resampling,
    shape,
    sorting,
    symbolic,
    unique,
)
