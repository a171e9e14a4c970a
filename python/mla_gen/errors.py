"""The errors a kernel folder raises: which file is wrong, how, and the command that fixes it.

All are RuntimeError subclasses (a corrupt manifest raised RuntimeError before these existed);
a missing image is also a FileNotFoundError. No torch, no driver: importable anywhere.
"""

from __future__ import annotations

__all__ = ["KernelFolderError", "ManifestError", "ImageError", "MissingImageError"]


class KernelFolderError(RuntimeError):
    """The kernel folder cannot serve: its manifest or one of its images is missing, corrupt or
    unsafe. The message names the file and the fix; nothing was handed to the driver."""


class ManifestError(KernelFolderError):
    """manifest.json unreadable, not JSON, of a schema version this package does not read, or
    naming an image outside its folder or without its size and sha256."""


class ImageError(KernelFolderError):
    """An image (CUBIN/PTX) whose size or sha256 differs from its manifest entry, refused before
    the driver sees it. ``file``: the image's path; ``kernel``: the kernel that needed it;
    ``expected`` and ``found``: ``(bytes, sha256)`` (``found`` None when the file is missing)."""

    def __init__(self, message: str, *, file: str, kernel: str, expected: tuple, found: tuple | None):
        super().__init__(message)
        self.file, self.kernel, self.expected, self.found = file, kernel, expected, found


class MissingImageError(ImageError, FileNotFoundError):
    """An image the manifest names that is not in the folder: the folder is incomplete."""
