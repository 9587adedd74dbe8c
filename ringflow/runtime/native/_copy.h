/* Byte copies that stay fast whatever the source and destination addresses are.
 *
 * glibc's memcpy copies mid-sized blocks (a few KiB up to its non-temporal threshold) with `rep movsb`. On AMD
 * Zen cores that instruction runs 10-20x slower (about 2 GB/s instead of 30) when the destination sits a few
 * bytes after the source modulo 4 KiB: a store then lands on the 4 KiB page offset the next loads read, and the
 * core waits on each of them. NumPy places large arrays 16 bytes into a page, shared-memory slots start on a page
 * boundary, so every slot -> array copy of 16 KiB-512 KiB hit that case. Copying such pairs from the end backwards
 * keeps stores behind the loads' offsets; every other pair goes to memcpy. */
#ifndef RINGFLOW_COPY_H
#define RINGFLOW_COPY_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define RF_ALIAS_WINDOW 64u   /* destination this many bytes (or fewer) after the source, modulo 4 KiB */
#define RF_ALIAS_MIN_BYTES 256u

static inline int rf_copy_aliases(const void *dst, const void *src, size_t n)
{
    size_t d = ((uintptr_t)dst - (uintptr_t)src) & 4095u;
    return n >= RF_ALIAS_MIN_BYTES && d != 0 && d < RF_ALIAS_WINDOW;
}

/* copy n bytes, last 64-byte block first: right for disjoint buffers and for a destination after the source */
static inline void rf_copy_backward(char *dst, const char *src, size_t n)
{
    size_t tail = n & 63u, m = n - tail;
    if (tail)
        memmove(dst + m, src + m, tail);
#if defined(__SSE2__)
    while (m) {
        m -= 64;
        __m128i a = _mm_loadu_si128((const __m128i *)(src + m));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + m + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + m + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(src + m + 48));
        _mm_storeu_si128((__m128i *)(dst + m), a);
        _mm_storeu_si128((__m128i *)(dst + m + 16), b);
        _mm_storeu_si128((__m128i *)(dst + m + 32), c);
        _mm_storeu_si128((__m128i *)(dst + m + 48), e);
    }
#else
    while (m) {
        m -= 64;
        memmove(dst + m, src + m, 64);
    }
#endif
}

/* memcpy (non-overlapping buffers) without the 4 KiB-alias slow case */
static inline void rf_copy(void *dst, const void *src, size_t n)
{
    if (rf_copy_aliases(dst, src, n))
        rf_copy_backward((char *)dst, (const char *)src, n);
    else
        memcpy(dst, src, n);
}

/* memmove (buffers may overlap) without the 4 KiB-alias slow case: a backward copy is also the right direction
 * when the destination starts inside the source */
static inline void rf_move(void *dst, const void *src, size_t n)
{
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (rf_copy_aliases(dst, src, n) && (d > s || d + n <= s))
        rf_copy_backward((char *)dst, (const char *)src, n);
    else
        memmove(dst, src, n);
}
#endif
