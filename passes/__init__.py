"""Graph passes: ``fx`` runs on the captured FX graph, ``onnx`` on the translated model."""
