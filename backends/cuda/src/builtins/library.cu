// Helpers of the xpu builtin kernels: number-format conversions done with integer
// arithmetic, saturating float -> integer casts, min/max that ignore NaN.
//
// Every conversion to f32, f16 or bf16 goes through `Unpacked`: a kind (zero, finite,
// infinite, NaN), a sign, a 30-bit significand `sig` with its leading one at bit 29, a
// `sticky` flag for nonzero bits below `sig`, and an unbiased exponent. That is enough
// of any source value (f64, i64, ...) to round it once, to nearest with ties to even,
// into a format of at most 24 significant bits; `xpu_encode` does exactly that,
// subnormal results, overflow to infinity and quiet NaNs included. A NaN keeps its sign
// and the leading bits of its payload and gets the quiet bit.

#define XPU_KIND_ZERO 0u
#define XPU_KIND_FINITE 1u
#define XPU_KIND_INF 2u
#define XPU_KIND_NAN 3u

struct XpuUnpacked {
    unsigned int kind;
    bool neg;
    unsigned int sig;
    bool sticky;
    int exp;
};

__device__ static XpuUnpacked xpu_unpacked(unsigned int kind, bool neg, unsigned int sig, bool sticky, int exp) {
    XpuUnpacked v;
    v.kind = kind;
    v.neg = neg;
    v.sig = sig;
    v.sticky = sticky;
    v.exp = exp;
    return v;
}

// sig >> k for k in 1..=31, rounded to nearest, ties to even.
__device__ static unsigned int xpu_shift_round(unsigned int sig, bool sticky, unsigned int k) {
    unsigned int q = sig >> k;
    unsigned int rem = sig & ((1u << k) - 1u);
    unsigned int halfway = 1u << (k - 1u);
    bool up = rem > halfway || (rem == halfway && (sticky || (q & 1u) == 1u));
    return q + (up ? 1u : 0u);
}

// The bits of v in the binary format with p fraction bits and w exponent bits.
__device__ static unsigned int xpu_encode(XpuUnpacked v, unsigned int p, unsigned int w) {
    unsigned int sign = v.neg ? (1u << (p + w)) : 0u;
    unsigned int ones = (1u << w) - 1u;
    unsigned int inf = sign | (ones << p);
    if (v.kind == XPU_KIND_ZERO) {
        return sign;
    }
    if (v.kind == XPU_KIND_INF) {
        return inf;
    }
    if (v.kind == XPU_KIND_NAN) {
        return inf | (1u << (p - 1u)) | (v.sig >> (29u - p));
    }
    int biased = v.exp + (int)(ones >> 1u);
    if (biased >= (int)ones) {
        return inf;
    }
    int extra = 1 - biased;
    if (extra < 0) {
        extra = 0;
    }
    unsigned int k = 29u - p + (unsigned int)extra;
    if (k > 31u) {
        k = 31u;
    }
    int b1 = biased > 1 ? biased : 1;
    return sign | ((((unsigned int)(b1 - 1)) << p) + xpu_shift_round(v.sig, v.sticky, k));
}

__device__ static XpuUnpacked xpu_unpack_f32(unsigned int x) {
    bool neg = (x >> 31u) == 1u;
    unsigned int biased = (x >> 23u) & 0xFFu;
    unsigned int fraction = x & 0x7FFFFFu;
    if (biased == 0xFFu) {
        if (fraction == 0u) {
            return xpu_unpacked(XPU_KIND_INF, neg, 0u, false, 0);
        }
        return xpu_unpacked(XPU_KIND_NAN, neg, fraction << 6u, false, 0);
    }
    if (biased == 0u) {
        if (fraction == 0u) {
            return xpu_unpacked(XPU_KIND_ZERO, neg, 0u, false, 0);
        }
        unsigned int s = (unsigned int)__clz(fraction) - 2u;
        return xpu_unpacked(XPU_KIND_FINITE, neg, fraction << s, false, -120 - (int)s);
    }
    return xpu_unpacked(XPU_KIND_FINITE, neg, (fraction | 0x800000u) << 6u, false, (int)biased - 127);
}

__device__ static XpuUnpacked xpu_unpack_f16(unsigned int h) {
    bool neg = ((h >> 15u) & 1u) == 1u;
    unsigned int biased = (h >> 10u) & 0x1Fu;
    unsigned int fraction = h & 0x3FFu;
    if (biased == 0x1Fu) {
        if (fraction == 0u) {
            return xpu_unpacked(XPU_KIND_INF, neg, 0u, false, 0);
        }
        return xpu_unpacked(XPU_KIND_NAN, neg, fraction << 19u, false, 0);
    }
    if (biased == 0u) {
        if (fraction == 0u) {
            return xpu_unpacked(XPU_KIND_ZERO, neg, 0u, false, 0);
        }
        unsigned int s = (unsigned int)__clz(fraction) - 2u;
        return xpu_unpacked(XPU_KIND_FINITE, neg, fraction << s, false, 5 - (int)s);
    }
    return xpu_unpacked(XPU_KIND_FINITE, neg, (fraction | 0x400u) << 19u, false, (int)biased - 15);
}

// An integer of magnitude m (negative when neg).
__device__ static XpuUnpacked xpu_unpack_u32(bool neg, unsigned int m) {
    if (m == 0u) {
        return xpu_unpacked(XPU_KIND_ZERO, false, 0u, false, 0);
    }
    unsigned int lz = (unsigned int)__clz(m);
    int e = 31 - (int)lz;
    if (lz >= 2u) {
        return xpu_unpacked(XPU_KIND_FINITE, neg, m << (lz - 2u), false, e);
    }
    unsigned int k = 2u - lz;
    return xpu_unpacked(XPU_KIND_FINITE, neg, m >> k, (m & ((1u << k) - 1u)) != 0u, e);
}

__device__ static XpuUnpacked xpu_unpack_i32(int x) {
    unsigned int bits = (unsigned int)x;
    bool neg = x < 0;
    return xpu_unpack_u32(neg, neg ? 0u - bits : bits);
}

__device__ static XpuUnpacked xpu_unpack_i64(long long x) {
    bool neg = x < 0;
    unsigned long long m = neg ? 0ull - (unsigned long long)x : (unsigned long long)x;
    unsigned int hi = (unsigned int)(m >> 32u);
    if (hi == 0u) {
        return xpu_unpack_u32(neg, (unsigned int)m);
    }
    unsigned int n = 64u - (unsigned int)__clz(hi);
    unsigned int k = n - 30u;
    bool sticky = (m & ((1ull << k) - 1ull)) != 0ull;
    return xpu_unpacked(XPU_KIND_FINITE, neg, (unsigned int)(m >> k), sticky, (int)n - 1);
}

__device__ static XpuUnpacked xpu_unpack_f64(double x) {
    unsigned long long bits = (unsigned long long)__double_as_longlong(x);
    unsigned int hi = (unsigned int)(bits >> 32u);
    unsigned int lo = (unsigned int)(bits & 0xFFFFFFFFull);
    bool neg = (hi >> 31u) == 1u;
    unsigned int biased = (hi >> 20u) & 0x7FFu;
    unsigned int high = hi & 0xFFFFFu;
    unsigned int lead = (high << 9u) | (lo >> 23u);
    bool rest = (lo & 0x7FFFFFu) != 0u;
    if (biased == 0x7FFu) {
        if ((high | lo) == 0u) {
            return xpu_unpacked(XPU_KIND_INF, neg, 0u, false, 0);
        }
        return xpu_unpacked(XPU_KIND_NAN, neg, lead, false, 0);
    }
    if (biased == 0u) {
        if ((high | lo) == 0u) {
            return xpu_unpacked(XPU_KIND_ZERO, neg, 0u, false, 0);
        }
        // Far below half the smallest subnormal of any narrower format.
        return xpu_unpacked(XPU_KIND_FINITE, neg, 0x20000000u, true, -1023);
    }
    return xpu_unpacked(XPU_KIND_FINITE, neg, 0x20000000u | lead, rest, (int)biased - 1023);
}

__device__ static float xpu_f32_from_f16(unsigned int h) {
    return __uint_as_float(xpu_encode(xpu_unpack_f16(h), 23u, 8u));
}

__device__ static float xpu_f32_from_bf16(unsigned int h) {
    unsigned int x = h << 16u;
    return __uint_as_float((x & 0x7FFFFFFFu) > 0x7F800000u ? (x | 0x400000u) : x);
}

__device__ static unsigned short xpu_f16_from_f32(float x) {
    return (unsigned short)xpu_encode(xpu_unpack_f32(__float_as_uint(x)), 10u, 5u);
}

__device__ static unsigned short xpu_bf16_from_f32(float x) {
    return (unsigned short)xpu_encode(xpu_unpack_f32(__float_as_uint(x)), 7u, 8u);
}

__device__ static bool xpu_is_nan_f32(float x) {
    return (__float_as_uint(x) & 0x7FFFFFFFu) > 0x7F800000u;
}

__device__ static bool xpu_is_nan_f64(double x) {
    return ((unsigned long long)__double_as_longlong(x) & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
}

// min/max: a NaN operand is ignored; on a tie (-0.0 vs +0.0) the first operand wins.
__device__ static float xpu_min_f32(float a, float b) {
    if (xpu_is_nan_f32(a)) {
        return b;
    }
    if (xpu_is_nan_f32(b)) {
        return a;
    }
    return b < a ? b : a;
}

__device__ static float xpu_max_f32(float a, float b) {
    if (xpu_is_nan_f32(a)) {
        return b;
    }
    if (xpu_is_nan_f32(b)) {
        return a;
    }
    return b > a ? b : a;
}

__device__ static double xpu_min_f64(double a, double b) {
    if (xpu_is_nan_f64(a)) {
        return b;
    }
    if (xpu_is_nan_f64(b)) {
        return a;
    }
    return b < a ? b : a;
}

__device__ static double xpu_max_f64(double a, double b) {
    if (xpu_is_nan_f64(a)) {
        return b;
    }
    if (xpu_is_nan_f64(b)) {
        return a;
    }
    return b > a ? b : a;
}

// Exact; a NaN keeps its payload and gets the quiet bit.
__device__ static double xpu_f64_from_f32(float x) {
    XpuUnpacked v = xpu_unpack_f32(__float_as_uint(x));
    unsigned int hi = v.neg ? 0x80000000u : 0u;
    unsigned int lo = 0u;
    if (v.kind == XPU_KIND_INF) {
        hi = hi | 0x7FF00000u;
    } else if (v.kind == XPU_KIND_NAN) {
        hi = hi | 0x7FF80000u | (v.sig >> 9u);
        lo = v.sig << 23u;
    } else if (v.kind == XPU_KIND_FINITE) {
        unsigned int fraction = v.sig & 0x1FFFFFFFu;
        hi = hi | (((unsigned int)(v.exp + 1023)) << 20u) | (fraction >> 9u);
        lo = fraction << 23u;
    }
    return __longlong_as_double((long long)(((unsigned long long)hi << 32u) | (unsigned long long)lo));
}

// Rounded once to nearest, ties to even, with integer arithmetic on the significand.
__device__ static double xpu_f64_from_i64(long long x) {
    bool neg = x < 0;
    unsigned long long m = neg ? 0ull - (unsigned long long)x : (unsigned long long)x;
    unsigned int hi = (unsigned int)(m >> 32u);
    if (hi < 0x200000u) {
        return (double)x;
    }
    unsigned int k = 64u - (unsigned int)__clz(hi) - 53u;
    unsigned long long q = m >> k;
    unsigned long long rem = m & ((1ull << k) - 1ull);
    unsigned long long halfway = 1ull << (k - 1u);
    bool up = rem > halfway || (rem == halfway && (q & 1ull) == 1ull);
    double v = (double)(q + (up ? 1ull : 0ull)) * (double)(1u << k);
    return neg ? -v : v;
}

__device__ static int xpu_i32_from_f32(float x) {
    if (x >= -2147483648.0f && x < 2147483648.0f) {
        return (int)x;
    }
    if (x > 0.0f) {
        return 2147483647;
    }
    if (x < 0.0f) {
        return (int)0x80000000u;
    }
    return 0;
}

__device__ static unsigned int xpu_u8_from_f32(float x) {
    if (x >= 1.0f && x < 256.0f) {
        return (unsigned int)x;
    }
    if (x >= 256.0f) {
        return 255u;
    }
    return 0u;
}

__device__ static long long xpu_i64_from_f32(float x) {
    if (x >= -9223372036854775808.0f && x < 9223372036854775808.0f) {
        return (long long)x;
    }
    if (x > 0.0f) {
        return 9223372036854775807ll;
    }
    if (x < 0.0f) {
        return -9223372036854775807ll - 1ll;
    }
    return 0ll;
}

__device__ static int xpu_i32_from_f64(double x) {
    if (x >= -2147483648.0 && x < 2147483648.0) {
        return (int)x;
    }
    if (x > 0.0) {
        return 2147483647;
    }
    if (x < 0.0) {
        return (int)0x80000000u;
    }
    return 0;
}

__device__ static unsigned int xpu_u8_from_f64(double x) {
    if (x >= 1.0 && x < 256.0) {
        return (unsigned int)x;
    }
    if (x >= 256.0) {
        return 255u;
    }
    return 0u;
}

__device__ static long long xpu_i64_from_f64(double x) {
    if (x >= -9223372036854775808.0 && x < 9223372036854775808.0) {
        return (long long)x;
    }
    if (x > 0.0) {
        return 9223372036854775807ll;
    }
    if (x < 0.0) {
        return -9223372036854775807ll - 1ll;
    }
    return 0ll;
}
