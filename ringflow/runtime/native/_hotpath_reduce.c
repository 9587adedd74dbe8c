/* The native executor's reductions: out = a (op) b elementwise for every dtype and op a plan can name, with
 * NumPy's results (integer wrap-around, NaN-propagating min/max, half precision rounded once from float). */
#include "_hotpath.h"

/* ------------------------------------------------------------------ reductions: out = a (op) b */
#define INT_LOOP(T, EXPR)                                                                                   \
    do {                                                                                                    \
        T *o = (T *)out;                                                                                    \
        const T *x = (const T *)a, *y = (const T *)b;                                                       \
        for (int64_t i = 0; i < n; i++) {                                                                   \
            T p = x[i], q = y[i];                                                                           \
            o[i] = (T)(EXPR);                                                                               \
        }                                                                                                   \
    } while (0)

/* integer ops wrap as NumPy's do: sums and products in the unsigned type of the same width */
#define INT_OPS(T, UT)                                                                                      \
    switch (op) {                                                                                           \
    case O_SUM: INT_LOOP(T, (UT)p + (UT)q); return 0;                                                       \
    case O_PROD: INT_LOOP(T, (UT)p * (UT)q); return 0;                                                      \
    case O_MIN: INT_LOOP(T, p < q ? p : q); return 0;                                                       \
    case O_MAX: INT_LOOP(T, p > q ? p : q); return 0;                                                       \
    case O_BAND: INT_LOOP(T, p & q); return 0;                                                              \
    case O_BOR: INT_LOOP(T, p | q); return 0;                                                               \
    case O_BXOR: INT_LOOP(T, p ^ q); return 0;                                                              \
    }                                                                                                       \
    return -1

/* NumPy's minimum/maximum: a NaN on either side wins */
#define FMIN(p, q) ((isnan(p) || (p) < (q)) ? (p) : (q))
#define FMAX(p, q) ((isnan(p) || (p) > (q)) ? (p) : (q))

#define FLOAT_OPS(T)                                                                                        \
    switch (op) {                                                                                           \
    case O_SUM: INT_LOOP(T, p + q); return 0;                                                               \
    case O_PROD: INT_LOOP(T, p * q); return 0;                                                              \
    case O_MIN: INT_LOOP(T, FMIN(p, q)); return 0;                                                          \
    case O_MAX: INT_LOOP(T, FMAX(p, q)); return 0;                                                          \
    }                                                                                                       \
    return -1

static inline float bf16_to_f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f_to_bf16(float f) /* round to nearest even, as ml_dtypes */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* half precision: computed in float and rounded once, as NumPy's float16 and ml_dtypes' bfloat16 do */
#define HALF_OPS(T, TO_F, FROM_F)                                                                           \
    do {                                                                                                    \
        T *o = (T *)out;                                                                                    \
        const T *x = (const T *)a, *y = (const T *)b;                                                       \
        for (int64_t i = 0; i < n; i++) {                                                                   \
            float p = TO_F(x[i]), q = TO_F(y[i]), r;                                                        \
            switch (op) {                                                                                   \
            case O_SUM: r = p + q; break;                                                                   \
            case O_PROD: r = p * q; break;                                                                  \
            case O_MIN: r = FMIN(p, q); break;                                                              \
            case O_MAX: r = FMAX(p, q); break;                                                              \
            default: return -1;                                                                             \
            }                                                                                               \
            o[i] = FROM_F(r);                                                                               \
        }                                                                                                   \
        return 0;                                                                                           \
    } while (0)

#define F16_TO_F(h) ((float)(h))
#define F_TO_F16(f) ((_Float16)(f))

int rf_reduce(int dtype, int op, void *out, const void *a, const void *b, int64_t n)
{
    switch (dtype) {
    case D_BOOL: {
        uint8_t *o = (uint8_t *)out;
        const uint8_t *x = (const uint8_t *)a, *y = (const uint8_t *)b;
        for (int64_t i = 0; i < n; i++) {
            uint8_t p = x[i] != 0, q = y[i] != 0;
            switch (op) {
            case O_SUM: case O_MAX: case O_BOR: o[i] = p | q; break;
            case O_PROD: case O_MIN: case O_BAND: o[i] = p & q; break;
            case O_BXOR: o[i] = p ^ q; break;
            default: return -1;
            }
        }
        return 0;
    }
    case D_I8: INT_OPS(int8_t, uint8_t);
    case D_U8: INT_OPS(uint8_t, uint8_t);
    case D_I16: INT_OPS(int16_t, uint16_t);
    case D_U16: INT_OPS(uint16_t, uint16_t);
    case D_I32: INT_OPS(int32_t, uint32_t);
    case D_U32: INT_OPS(uint32_t, uint32_t);
    case D_I64: INT_OPS(int64_t, uint64_t);
    case D_U64: INT_OPS(uint64_t, uint64_t);
    case D_F32: FLOAT_OPS(float);
    case D_F64: FLOAT_OPS(double);
    case D_F16: HALF_OPS(_Float16, F16_TO_F, F_TO_F16);
    case D_BF16: HALF_OPS(uint16_t, bf16_to_f, f_to_bf16);
    }
    return -1;
}
