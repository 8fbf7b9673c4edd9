"""Ray Train and Tune write their files to local storage whole or not at all.

Ray persists a run's files (Tune's experiment state, trial results and errors, checkpoints) by
copying them onto the storage path with pyarrow, in place: on a full disk the copy stops half-way
and leaves a truncated `experiment_state-*.json` or a zero-byte `error.pkl` where the last good
file was, and a later `Tuner.restore` fails on it or, finding no readable state, starts the
experiment afresh. This filesystem, given to Ray through `RunConfig(storage_filesystem=...)` (its
documented hook), writes each file under a temporary name beside it and renames it onto its name
once complete, so a failed write leaves the previous version in place (vacsr/atomic.py does the
same for vacsr's own files). Object stores (s3://, gs://) write whole objects already.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from vacsr.atomic import require_regular_target, temp_file_beside


class _AtomicOutput(io.RawIOBase):
    """A binary file that appears at `path` on close() only if every write succeeded."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path, self._file, self._failed = path, None, False
        require_regular_target(path)  # a rename onto a device or folder would replace it
        # its folder created as pyarrow's local output streams do
        fd, self.tmp = temp_file_beside(Path(path).absolute(), suffix=".part")
        self._file = os.fdopen(fd, "wb")

    def writable(self) -> bool:
        return True

    def _discard(self) -> None:
        """A write failed: drop the temporary file at once (a writer that gave up may never
        close this stream), and keep what `path` held."""
        self._failed = True
        try:
            self._file.close()
        except OSError:
            pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass

    def write(self, data) -> int:
        if self._failed:
            raise OSError(f"{self.path}: an earlier write to this file failed")
        try:
            return self._file.write(data)
        except BaseException:
            self._discard()
            raise

    def flush(self) -> None:
        if not self._failed and self._file is not None and not self._file.closed:
            try:
                self._file.flush()
            except BaseException:
                self._discard()
                raise

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self._failed:
                try:
                    self._file.close()  # the last buffered bytes: a full disk can fail here
                    os.replace(self.tmp, self.path)
                except BaseException:
                    self._discard()
                    raise
        finally:
            super().close()

    def __del__(self) -> None:  # dropped without close(): the writer gave up, keep the old file
        if self._file is not None and not self.closed and not self._failed:
            self._discard()
        super().close()


class AtomicLocalHandler(pafs.FileSystemHandler):
    """The local filesystem, with output streams that write whole files."""

    def __init__(self) -> None:
        self._local = pafs.LocalFileSystem()

    def __eq__(self, other) -> bool:
        return isinstance(other, AtomicLocalHandler)

    def __ne__(self, other) -> bool:
        return not self == other

    def __reduce__(self):  # Ray sends the filesystem to its workers
        return (AtomicLocalHandler, ())

    def get_type_name(self) -> str:
        return "vacsr-atomic-local"

    def normalize_path(self, path):
        return self._local.normalize_path(path)

    def get_file_info(self, paths):
        return self._local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self._local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self._local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self._local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self._local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("vacsr: refusing to delete the contents of the root folder")

    def delete_file(self, path):
        self._local.delete_file(path)

    def move(self, src, dest):
        self._local.move(src, dest)

    def copy_file(self, src, dest):
        with self._local.open_input_stream(src) as source, \
                self.open_output_stream(dest, None) as target:
            while chunk := source.read(1 << 20):
                target.write(chunk)

    def open_input_stream(self, path):
        return self._local.open_input_stream(path)

    def open_input_file(self, path):
        return self._local.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return pa.PythonFile(_AtomicOutput(path), mode="w")

    def open_append_stream(self, path, metadata):
        return self._local.open_append_stream(path)


def ray_storage(path: str) -> tuple[str, pafs.FileSystem | None]:
    """(storage_path, storage_filesystem) for Ray's RunConfig: a local folder gets the atomic
    filesystem; a URI (s3://, gs://, file://) is left to Ray."""
    if "://" in path:
        return path, None
    return os.path.abspath(os.path.expanduser(path)), pafs.PyFileSystem(AtomicLocalHandler())
