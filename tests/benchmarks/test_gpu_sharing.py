"""The GPU-sharing benchmark up to the device boundary: a fake benchmark and a fake MPS control
binary stand in for the GPU and the driver's daemon."""

from __future__ import annotations

import stat

import pytest

from tests.helpers.scripts import load_script

# a "benchmark" whose rate says whether it ran as an MPS client (the pipe directory in its env)
FAKE_BENCH = """
import json, os, sys
out = sys.argv[sys.argv.index("--out") + 1]
mps = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
if "--fail" in sys.argv and mps:  # fails only as an MPS client
    print("the device fell over"); sys.exit(3)
with open(out, "w") as f:
    json.dump({"results": [{"slots_tok_s": 20.0 if mps else 10.0}], "pipe": mps}, f)
"""


def _control(tmp_path):
    """A stand-in for nvidia-cuda-mps-control that logs its arguments, pipe directory and stdin."""
    log = tmp_path / "control.log"
    path = tmp_path / "bin" / "fake-mps-control"
    path.parent.mkdir()
    path.write_text(f"""#!/bin/sh
echo "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> {log}
if [ "$1" != "-d" ]; then cat >> {log}; fi
""")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path, log


def test_three_modes_their_ratios_and_a_private_daemon(tmp_path, capsys) -> None:
    bench = load_script("experiments/benchmarks/gpu_sharing.py")
    fake = tmp_path / "bench.py"
    fake.write_text(FAKE_BENCH)
    control, log = _control(tmp_path)
    result = bench.main(["--copies", "3", "--bench", str(fake), "--control", str(control),
                         "--out", str(tmp_path / "r.json")])
    rows = result["rows"]
    assert rows["alone"]["aggregate_tok_s"] == 10.0 and rows["alone"]["copies"] == 1
    assert rows["time-sliced"]["per_copy_tok_s"] == [10.0] * 3
    assert rows["mps"]["per_copy_tok_s"] == [20.0] * 3 and rows["mps"]["aggregate_tok_s"] == 60.0
    printed = capsys.readouterr().out
    assert "mps" in printed and " 6.00 " in printed and " 3.00 " in printed  # aggregate ÷ alone
    # the daemon was started, then told to quit, with the pipe directory its clients used
    lines = log.read_text().splitlines()
    assert lines[0].startswith("args=-d pipe=/tmp/gpu-sharing-") and lines[0].split()[1].endswith("/mps/pipe")
    assert lines[1].startswith("args= pipe=" + lines[0].split("pipe=")[1].split()[0]) and lines[2] == "quit"
    assert (tmp_path / "r.json").exists()


def test_a_failing_copy_is_reported_with_its_output_and_the_daemon_still_stops(tmp_path) -> None:
    bench = load_script("experiments/benchmarks/gpu_sharing.py")
    fake = tmp_path / "bench.py"
    fake.write_text(FAKE_BENCH)
    control, log = _control(tmp_path)
    with pytest.raises(RuntimeError, match="exited with 3:\nthe device fell over"):
        bench.main(["--copies", "2", "--bench", str(fake), "--control", str(control), "--modes", "mps",
                    "--", "--fail"])
    assert log.read_text().splitlines()[-1] == "quit"


def test_no_mps_binary_is_a_clear_error(tmp_path) -> None:
    bench = load_script("experiments/benchmarks/gpu_sharing.py")
    with pytest.raises(RuntimeError, match="needs no-such-mps-control on PATH"):
        with bench.mps_daemon(tmp_path, "no-such-mps-control"):
            pass
