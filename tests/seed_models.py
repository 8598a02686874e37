"""Models from the seed torch.onnx docs (../shared/torch-onnx-docs), shared by the tests that
export them."""

import torch


@torch.jit.script
def loop(x, y):
    for i in range(int(y)):
        x = x + i
    return x


class LoopModel2(torch.nn.Module):
    """A module calling a scripted loop whose trip count is an input."""

    def forward(self, x, y):
        return loop(x, y)
