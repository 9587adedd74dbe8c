"""Types of the C extension built from _streamcopy.c (absent when there was no compiler at install time)."""

STREAMING: int  # 1 when built with streaming stores (SSE2), else 0 (copy is then a plain memcpy)
ALIAS_MIN_BYTES: int  # copies from this size can hit memcpy's 4 KiB-alias slow case (_copy.h); move avoids it

def copy(dst_addr: int, src_addr: int, nbytes: int, /) -> None:
    """Copy nbytes with streaming stores (no read of the destination), the GIL released."""

def move(dst_addr: int, src_addr: int, nbytes: int, /) -> None:
    """memmove nbytes without the 4 KiB-alias slow case of glibc's rep movsb (_copy.h), the GIL released."""
