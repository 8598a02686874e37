"""Kill a real save at many instants and check what is left on disk: ``python -m tests.save_killer
DIRECTORY STRIDE TAIL`` prints a JSON summary.

Two models of different layouts (so that the old model with the new data file cannot pass for
either) are saved in turn over ``DIRECTORY/m.onnx`` with external data. Each save runs in a forked
child that sends itself SIGKILL at its N-th executed line of dynexport/files.py: at every
STRIDE-th line of a whole save, and at each of its last TAIL lines (where the files are renamed
into place and the replaced ones removed). After each kill onnxruntime must load the model and compute what
one of the two models computes.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import onnxruntime as ort
import torch

import dynexport
import dynexport.files as files


def _program(hidden: int) -> dynexport.ONNXProgram:
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4)).eval()
    return dynexport.export(model, (torch.randn(3, 16),))


def _lines_of_a_save(program: dynexport.ONNXProgram, path: str, kill_at: int | None) -> int:
    """Save with a line counter on files.py; SIGKILL at line ``kill_at``. The lines executed."""
    count = 0

    def on_line(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return on_line

    def on_call(frame, event, arg):
        return on_line if frame.f_code.co_filename == files.__file__ else None

    sys.settrace(on_call)
    try:
        program.save(path, external_data=True)
    finally:
        sys.settrace(None)
    return count


def _output(path: str, x) -> list | None:
    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        return session.run(None, {"input": x})[0].tolist()
    except Exception:  # noqa: BLE001 - an unloadable pair is a finding
        return None


def main(directory: str, stride: int, tail: int) -> dict:
    files.EXTERNAL_DATA_MIN_TENSOR_BYTES = 0
    torch.manual_seed(0)
    programs = [_program(32), _program(8)]
    x = torch.randn(3, 16)
    expected = [p(x).tolist() for p in programs]
    scratch = os.path.join(directory, "scratch")
    os.makedirs(scratch)
    lines = _lines_of_a_save(programs[1], os.path.join(scratch, "m.onnx"), None)
    path = os.path.join(directory, "m.onnx")
    programs[0].save(path, external_data=True)
    points = sorted({*range(1, lines + 1, stride), *range(max(1, lines - tail + 1), lines + 1)})
    current, killed, mixed = 0, 0, []
    for point in points:
        new = 1 - current
        child = os.fork()
        if child == 0:
            _lines_of_a_save(programs[new], path, point)
            os._exit(0)
        _, status = os.waitpid(child, 0)
        killed += os.WIFSIGNALED(status)
        output = _output(path, x.numpy())
        if output == expected[new]:
            current = new
        elif output != expected[current]:
            mixed.append(point)
    left = sorted(name for name in os.listdir(directory) if name != "scratch")
    return {"lines": lines, "points": len(points), "killed": killed, "mixed": mixed, "left": left}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
