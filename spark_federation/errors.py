"""Errors of the mesh-health job."""

from __future__ import annotations

from hearthnet.errors import HearthNetError


class MeshHealthError(HearthNetError):
    """The job cannot run as asked: bad input path, bad argument, no usable records.

    Raised before or while the job runs; the CLI prints its message on one line
    and exits 1. Fix the argument or the input named in the message and run again.
    """
