"""The local S3 server of the tests and the benchmarks (datastore/seaweedfs.py): started again on
its directory, after an outage, it serves the same objects at the same address to the same
credentials, so what was configured against it keeps working."""

from __future__ import annotations

from datastore.seaweedfs import seaweedfs


def test_a_restart_on_the_same_directory_serves_the_same_data_at_the_same_address(tmp_path):
    with seaweedfs(tmp_path / "s3") as first:
        first.filesystem().pipe_file(f"{first.bucket}/kept.txt", b"written before the outage")
    with seaweedfs(tmp_path / "s3") as second:
        assert second.environment() == first.environment()
        assert second.filesystem().cat_file(f"{second.bucket}/kept.txt") == b"written before the outage"


def test_a_second_server_on_a_directory_in_use_is_refused_in_one_sentence(tmp_path):
    with seaweedfs(tmp_path / "s3"):
        try:
            with seaweedfs(tmp_path / "s3"):
                raise AssertionError("two servers started on one directory")
        except RuntimeError as refused:
            assert f"{tmp_path / 's3'} is served on ports " in str(refused)
            assert "which something else holds now" in str(refused)
