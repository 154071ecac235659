"""trajplatform.safefiles: nothing the platform writes next to a user's path follows a planted link."""
from __future__ import annotations

import os

import pytest

from trajplatform.safefiles import UnsafePathError, atomic_output, open_exclusive, open_regular, private_directory


@pytest.fixture()
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text("precious")
    return path


def test_atomic_output_replaces_a_link_planted_at_the_tmp_name_and_leaves_its_target(tmp_path, victim):
    out = tmp_path / "out.jsonl"
    os.symlink(victim, tmp_path / "out.jsonl.tmp")
    with atomic_output(out, force=False) as fh:
        fh.write(b"line\n")
    assert victim.read_text() == "precious"
    assert out.read_bytes() == b"line\n" and not out.is_symlink()
    assert not os.path.lexists(tmp_path / "out.jsonl.tmp")


def test_atomic_output_with_force_replaces_a_link_at_the_path_itself_not_its_target(tmp_path, victim):
    out = tmp_path / "out.jsonl"
    os.symlink(victim, out)
    with pytest.raises(FileExistsError):
        with atomic_output(out, force=False) as fh:
            fh.write(b"x")
    with atomic_output(out, force=True) as fh:
        fh.write(b"new")
    assert victim.read_text() == "precious" and out.read_bytes() == b"new" and not out.is_symlink()


def test_atomic_output_leaves_nothing_when_the_block_fails(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_output(out, force=True) as fh:
            fh.write(b"half")
            raise RuntimeError("boom")
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_atomic_output_refuses_a_directory_at_the_tmp_name(tmp_path):
    (tmp_path / "out.jsonl.tmp").mkdir()
    with pytest.raises(UnsafePathError, match="is a directory"):
        with atomic_output(tmp_path / "out.jsonl", force=True):
            pass


def test_open_exclusive_refuses_any_existing_entry_a_dangling_link_included(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    with pytest.raises(FileExistsError):
        open_exclusive(tmp_path / "link")
    assert not (tmp_path / "nowhere").exists()


def test_private_directory_refuses_a_link_to_a_directory(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "parts")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        private_directory(tmp_path / "parts")
    assert private_directory(tmp_path / "fresh").is_dir()


def test_open_regular_refuses_links_and_fifos(tmp_path, victim):
    os.symlink(victim, tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        open_regular(tmp_path / "link")
    with pytest.raises(UnsafePathError, match="special file"):
        open_regular(tmp_path / "fifo")
    with open_regular(victim) as fh:
        assert fh.read() == b"precious"
