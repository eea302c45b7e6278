"""GPU out-of-memory messages in a job's output (healthcheck/records/gpu_oom.py): the signatures are
data, the matcher is pure, and host-memory messages are not GPU OOM. Fixtures are real-format job
output (a PyTorch traceback, NCCL's WARN lines, host OOM as Python, TensorFlow and slurmstepd
print it)."""
import os

import pytest

from healthcheck.records import gpu_oom

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "job-output")


def fixture(name: str) -> bytes:
    with open(os.path.join(FIXTURES, name), "rb") as handle:
        return handle.read()


def test_the_shipped_signatures_parse_and_name_pytorch_cuda_and_nccl():
    names = {s.name for s in gpu_oom.signatures()}
    assert {"pytorch", "cuda_runtime", "cuda_driver", "nccl"} <= names
    assert all(s.text for s in gpu_oom.signatures())


def test_a_pytorch_oom_traceback_is_found_with_its_line():
    found = gpu_oom.find(fixture("pytorch-cuda-oom.err"), truncated=False, stream="stderr")
    assert found["kind"] == "gpu_oom" and found["source"] == "job_output" and found["stream"] == "stderr"
    assert found["signature"] == "pytorch"
    assert found["line"].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.")
    assert len(found["line"]) == gpu_oom.LINE_SHOWN and found["line"].endswith("...")


def test_nccl_cuda_failure_is_found_and_the_last_matching_line_wins():
    found = gpu_oom.find(fixture("nccl-cuda-oom.err"), truncated=False, stream="stdout")
    assert found["signature"] == "nccl"
    assert found["line"].endswith("NCCL WARN Failed to CUDA calloc 6291456 bytes")


@pytest.mark.parametrize("line,name", [
    ("RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
     "8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)", "pytorch"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty "
     "of 6.00 GiB of which 0 bytes is free.", "pytorch"),
    ("RuntimeError: CUDA error: out of memory", "cuda_runtime"),
    ("torch.AcceleratorError: CUDA error: out of memory", "cuda_runtime"),
    ("CUDA error: out of memorySearch for `cudaErrorMemoryAllocation' in https://docs.nvidia.com/cuda/",
     "cuda_runtime"),
    ("2019-07-21 23:23:06.228049: E tensorflow/stream_executor/cuda/cuda_driver.cc:828] failed to allocate "
     "32.00M (33554432 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "cuda_driver"),
    ("VM-0-16-ubuntu:392:494 [2] enqueue.cc:43 NCCL WARN Cuda failure 'out of memory'", "nccl"),
])
def test_each_known_message_is_recognised(line, name):
    found = gpu_oom.find(("noise before\n" + line + "\nnoise after\n").encode(), truncated=False, stream="stderr")
    assert found is not None and found["signature"] == name


def test_host_memory_messages_are_not_gpu_oom():
    assert gpu_oom.find(fixture("host-oom.err"), truncated=False, stream="stderr") is None


@pytest.mark.parametrize("text", [b"", b"CUDA out of memor", b"cuda out of memory. tried to allocate 2 GiB",
                                  b"Epoch 1 done\nall good\n"])
def test_near_misses_and_empty_output_are_not_evidence(text):
    assert gpu_oom.find(text, truncated=False, stream="stdout") is None


def test_a_tail_that_starts_inside_a_line_drops_that_fragment():
    line = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    # The fragment left of the cut still reads as a message; it is not a whole line of the file.
    fragment = line[5:]
    assert gpu_oom.find(fragment + b"next line\n", truncated=True, stream="stderr") is None
    assert gpu_oom.find(fragment + b"next line\n", truncated=False, stream="stderr") is not None
    assert gpu_oom.find(b"cut\n" + line, truncated=True, stream="stderr") is not None


def test_the_line_is_escaped_for_a_terminal_and_bounded():
    evil = b"\x1b[2J\x1b]0;owned\x07CUDA error: out of memory \xff\xfe" + b"A" * 500 + b"\n"
    found = gpu_oom.find(evil, truncated=False, stream="stderr")
    assert found is not None
    assert "\x1b" not in found["line"] and "\x07" not in found["line"]
    assert found["line"].startswith("\\x1b[2J\\x1b]0;owned\\x07CUDA error: out of memory")
    assert len(found["line"]) <= gpu_oom.LINE_SHOWN


def test_progress_bars_with_carriage_returns_split_lines():
    text = b"step 1/10\rstep 2/10\rRuntimeError: CUDA error: out of memory\rstep 3/10\n"
    found = gpu_oom.find(text, truncated=False, stream="stderr")
    assert found["line"] == "RuntimeError: CUDA error: out of memory"


@pytest.mark.parametrize("bad", ["pytorch CUDA out of memory\n", "\tonly text\n", "name\t \n"])
def test_a_malformed_signature_line_is_an_error(bad):
    with pytest.raises(ValueError, match="gpu-oom-signatures.tsv:1"):
        gpu_oom.parse_signatures(bad)
