"""One behaviour, both backends: every test runs on the local bubblewrap backend (for real)
and on the OpenSandbox backend (the real SDK against the loopback fake in opensandbox_fake.py)."""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import uuid
from typing import Any

import pytest

from apps.engines.models import SandboxRecord
from apps.engines.sandboxes import (
    MANAGED_LABEL,
    RECORD_LABEL,
    ExecResult,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxSpec,
)

pytestmark = pytest.mark.usefixtures("sandbox_settings")


def _labels(**extra: str) -> dict[str, str]:
    return {"suite": f"c-{uuid.uuid4().hex[:12]}", **extra}


def test_create_returns_a_ready_sandbox_with_its_record(backend: Any) -> None:
    labels = _labels(role="worker")
    with backend.create(SandboxSpec(labels=labels)) as sandbox:
        assert sandbox.id
        assert sandbox.labels[MANAGED_LABEL] == "true"
        record = SandboxRecord.objects.get(backend=backend.name, external_id=sandbox.id)
        assert record.state == SandboxRecord.State.READY
        assert sandbox.labels[RECORD_LABEL] == str(record.pk)
        assert record.labels["role"] == "worker"
        assert record.expires_at is not None and record.ready_at is not None
        again = backend.get(sandbox.id)
        assert again.id == sandbox.id and again.labels["suite"] == labels["suite"]
        assert again.run("echo reconnected", timeout=30).stdout == "reconnected\n"


def test_run_streams_output_while_the_command_is_still_running(backend: Any) -> None:
    # The command prints "first", then waits for a file that only the on_output callback
    # creates when it sees "first". Buffered (non-live) output can never release it: the
    # command would hit its timeout instead of printing "second".
    with backend.create(SandboxSpec(labels=_labels())) as sandbox:
        seen: list[tuple[str, str]] = []

        def on_output(stream: str, line: str) -> None:
            seen.append((stream, line))
            if line == "first":
                sandbox.write_file("gate", b"go")

        result = sandbox.run(
            "echo first; while [ ! -e gate ]; do sleep 0.05; done; echo second; echo done >&2",
            timeout=20,
            on_output=on_output,
        )
    assert not result.timed_out, result
    assert result.exit_code == 0
    assert [line for stream, line in seen if stream == "stdout"] == ["first", "second"]
    assert ("stderr", "done") in seen
    assert result.stdout == "first\nsecond\n"
    assert result.stderr == "done\n"


def test_non_zero_exit_is_reported_with_both_streams(backend: Any) -> None:
    with backend.create(SandboxSpec(labels=_labels())) as sandbox:
        result = sandbox.run("echo out; echo err >&2; exit 7", timeout=30)
        argv = sandbox.run(["printf", "%s|", "a b", "$HOME", "c"], timeout=30)
        signalled = sandbox.run(["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], timeout=30)
    assert isinstance(result, ExecResult)
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert not result.ok and not result.timed_out and result.duration_ms >= 0
    # A list is an argv: no shell, no word splitting, no expansion.
    assert argv.exit_code == 0 and argv.stdout == "a b|$HOME|c|\n"
    assert signalled.exit_code == 128 + 15


def test_arun_gives_what_run_gives(backend: Any) -> None:
    # The awaitable twin: on the loop itself where the backend can, else `run` in a worker thread.
    calls: list[dict[str, Any]] = [
        dict(cmd="echo out; echo err >&2; exit 7", timeout=30),
        dict(cmd=["printf", "%s|", "a b", "$HOME"], timeout=30, env={"X": "1"}),
        dict(cmd="echo started; sleep 30; echo never", timeout=1),
    ]
    with backend.create(SandboxSpec(labels=_labels())) as sandbox:
        expected = [sandbox.run(**kwargs) for kwargs in calls]

        async def main() -> list[ExecResult]:
            return [await sandbox.arun(**kwargs) for kwargs in calls]

        got = asyncio.run(main())
    assert [dataclasses.replace(r, duration_ms=0) for r in got] == [
        dataclasses.replace(r, duration_ms=0) for r in expected]
    assert got[0].exit_code == 7 and got[2].killed_by == "timeout"


def test_timeout_kills_the_command_and_the_sandbox_stays_usable(backend: Any) -> None:
    with backend.create(SandboxSpec(labels=_labels())) as sandbox:
        result = sandbox.run("echo started; sleep 30; echo never", timeout=1)
        after = sandbox.run("echo still here", timeout=30)
    assert result.timed_out
    assert result.exit_code is None
    assert result.killed_by == "timeout"
    assert "started" in result.stdout and "never" not in result.stdout
    assert 1000 <= result.duration_ms
    assert after.ok and after.stdout == "still here\n"


def test_output_beyond_the_cap_is_truncated_not_buffered(backend: Any) -> None:
    lines: list[tuple[str, str]] = []
    with backend.create(SandboxSpec(labels=_labels())) as sandbox:
        result = sandbox.run(
            ["python3", "-c", "import sys\nfor i in range(20000): print(f'line {i:05d}')\nprint('tail', file=sys.stderr)"],
            timeout=60,
            max_output_bytes=10_000,
            on_output=lambda stream, line: lines.append((stream, line)),
        )
    assert result.exit_code == 0
    assert result.truncated
    # Head and tail are kept, with a marker in between; never more than the cap (+ the marker).
    assert result.stdout.startswith("line 00000\n")
    assert result.stdout.endswith("line 19999\n")
    assert "bytes of stdout omitted" in result.stdout
    assert len(result.stdout.encode()) < 10_000 + 200
    assert result.stderr == "tail\n"
    stdout_lines = [line for stream, line in lines if stream == "stdout"]
    assert stdout_lines[0] == "line 00000"
    assert stdout_lines[-1].startswith("[output truncated")
    assert len(stdout_lines) <= 10_000 // len("line 00000\n") + 1


def test_files_round_trip_byte_exact_with_mode(backend: Any) -> None:
    data = bytes(range(256)) * 64
    with backend.create(SandboxSpec(labels=_labels())) as sandbox:
        sandbox.write_file("dir/sub/data.bin", data, mode=0o640)
        back = sandbox.read_file("/workspace/dir/sub/data.bin")
        head = sandbox.read_file("dir/sub/data.bin", max_bytes=10)
        inside = sandbox.run("sha256sum dir/sub/data.bin; stat -c %a dir/sub/data.bin", timeout=30)
        sandbox.write_file("dir/sub/data.bin", b"replaced")
        replaced = sandbox.read_file("dir/sub/data.bin")
        made_inside = sandbox.run("printf 'from inside' > made.txt", timeout=30)
        from_inside = sandbox.read_file("made.txt")
    assert back == data
    assert head == data[:10]
    digest, mode = inside.stdout.split("\n")[0].split()[0], inside.stdout.split("\n")[1]
    assert digest == hashlib.sha256(data).hexdigest()
    assert mode == "640"
    assert replaced == b"replaced"
    assert made_inside.ok and from_inside == b"from inside"


def test_reading_a_missing_file_raises_file_not_found(backend: Any) -> None:
    with backend.create(SandboxSpec(labels=_labels())) as sandbox:
        with pytest.raises(SandboxFileNotFound) as excinfo:
            sandbox.read_file("no/such/file.txt")
        sandbox.write_file("empty.txt", b"")
        assert sandbox.read_file("empty.txt") == b""
    assert isinstance(excinfo.value, FileNotFoundError)
    assert "no/such/file.txt" in str(excinfo.value)


def test_destroy_is_idempotent_and_unknown_ids_are_fine(backend: Any) -> None:
    sandbox = backend.create(SandboxSpec(labels=_labels()))
    sandbox_id = sandbox.id
    sandbox.destroy()
    sandbox.destroy()
    assert backend.destroy(sandbox_id) is False
    assert backend.destroy("does-not-exist") is False
    with pytest.raises(SandboxNotFound):
        backend.get(sandbox_id)
    with pytest.raises(SandboxNotFound):
        sandbox.run("true", timeout=5)
    record = SandboxRecord.objects.get(backend=backend.name, external_id=sandbox_id)
    assert record.state == SandboxRecord.State.DESTROYED
    assert record.destroyed_at is not None


def test_context_manager_destroys_on_exit_even_after_an_error(backend: Any) -> None:
    with pytest.raises(RuntimeError):
        with backend.create(SandboxSpec(labels=_labels())) as sandbox:
            raise RuntimeError("agent crashed")
    with pytest.raises(SandboxNotFound):
        backend.get(sandbox.id)


def test_list_filters_by_labels(backend: Any) -> None:
    suite = _labels()["suite"]
    first = backend.create(SandboxSpec(labels={"suite": suite, "role": "a"}))
    second = backend.create(SandboxSpec(labels={"suite": suite, "role": "b"}))
    try:
        both = {info.id for info in backend.list({"suite": suite})}
        only_a = [info.id for info in backend.list({"suite": suite, "role": "a"})]
        managed = {info.id for info in backend.list({MANAGED_LABEL: "true"})}
        none = backend.list({"suite": "nobody-uses-this"})
        first.destroy()
        after = {info.id for info in backend.list({"suite": suite})}
    finally:
        first.destroy()
        second.destroy()
    assert both == {first.id, second.id}
    assert only_a == [first.id]
    assert {first.id, second.id} <= managed
    assert none == []
    assert after == {second.id}
    assert second.id not in {info.id for info in backend.list()}


def test_env_and_cwd_reach_the_command(backend: Any) -> None:
    spec = SandboxSpec(env={"FROM_SPEC": "spec", "OVERRIDE": "spec"}, labels=_labels())
    with backend.create(spec) as sandbox:
        sandbox.write_file("sub/marker", b"x")
        result = sandbox.run(
            'echo "$FROM_SPEC $OVERRIDE $FROM_RUN"; pwd; ls', timeout=30, cwd="sub",
            env={"OVERRIDE": "run", "FROM_RUN": "run"},
        )
    assert result.stdout == "spec run run\n/workspace/sub\nmarker\n"
