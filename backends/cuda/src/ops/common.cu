// Shared part of the xpu standard-operation kernels (after the builtins' helper library
// and the dtype prelude, which defines `xpu_s`, the storage type, and `xpu_w`, the type
// arithmetic runs in).
//
// Every kernel takes one `XpuOpParams` by value (mirrored by `OpParams` in mod.rs, the
// two must stay identical): up to eight tensors in the order of the operation's
// operands (device address of element 0, dims, strides in elements, rank), sizes,
// integer words and float parameters. `word[3]`, when nonzero, is the address of the
// operation's index-check record: a kernel that writes returns at once when the check
// found a bad index, so a failed operation writes nothing.

struct XpuOpParams {
    unsigned long long ptr[8];
    unsigned long long dims[8][4];
    unsigned long long strides[8][4];
    unsigned long long size[4];
    unsigned long long word[4];
    float f[8];
    unsigned int rank[8];
};

// What the index check records (mirrored by `IndexCheck` in check.rs).
struct XpuIndexRecord {
    unsigned int bad;
    int value;
    unsigned long long position;
};

#define XPU_BLOCK 256

#define XPU_FOR(e, total)                                                              \
    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
         e < (total); e += (unsigned long long)gridDim.x * blockDim.x)

// The element offset of the n-th element (row-major) of tensor t.
__device__ static unsigned long long xpu_off(const XpuOpParams& p, int t, unsigned long long n) {
    unsigned long long o = 0ull;
    for (int k = (int)p.rank[t] - 1; k >= 0; k--) {
        unsigned long long d = p.dims[t][k];
        o += (n % d) * p.strides[t][k];
        n /= d;
    }
    return o;
}

// The element offset of [r, j] in the rank-2 tensor t.
__device__ static unsigned long long xpu_off2(const XpuOpParams& p, int t, unsigned long long r, unsigned long long j) {
    return r * p.strides[t][0] + j * p.strides[t][1];
}

// Whether the operation's index check found a bad index.
__device__ static bool xpu_rejected(const XpuOpParams& p) {
    if (p.word[3] == 0ull) {
        return false;
    }
    const volatile XpuIndexRecord* rec = (const volatile XpuIndexRecord*)p.word[3];
    return rec->bad != 0u;
}

// Index check: tensor 0 is the i32 indices (rank 1), size[0] the bound, word[0] whether
// -1 is allowed (ignored labels). One block; records the first bad position.
extern "C" __global__ void xpu_op_check_indices(XpuOpParams p) {
    __shared__ unsigned long long first[XPU_BLOCK];
    const int* idx = (const int*)p.ptr[0];
    unsigned long long n = p.dims[0][0];
    unsigned long long s = p.strides[0][0];
    unsigned long long none = ~0ull;
    unsigned long long best = none;
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
        int v = idx[i * s];
        bool ok = (v >= 0 && (unsigned long long)v < p.size[0]) || (p.word[0] != 0ull && v == -1);
        if (!ok) {
            best = i;
            break;
        }
    }
    first[threadIdx.x] = best;
    __syncthreads();
    for (unsigned int step = XPU_BLOCK / 2u; step > 0u; step >>= 1u) {
        if (threadIdx.x < step && first[threadIdx.x + step] < first[threadIdx.x]) {
            first[threadIdx.x] = first[threadIdx.x + step];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0u && first[0] != none) {
        volatile XpuIndexRecord* rec = (volatile XpuIndexRecord*)p.word[3];
        rec->value = idx[first[0] * s];
        rec->position = first[0];
        __threadfence_system();
        rec->bad = 1u;
    }
}

// Philox 4x32-10 (as the HAL's `philox4x32_10`): the four outputs for counter
// (ctr low, ctr high, 0, 0) under key (seed low, seed high).
__device__ static void xpu_philox(unsigned long long seed, unsigned long long ctr, unsigned int out[4]) {
    unsigned int c0 = (unsigned int)ctr;
    unsigned int c1 = (unsigned int)(ctr >> 32);
    unsigned int c2 = 0u;
    unsigned int c3 = 0u;
    unsigned int k0 = (unsigned int)seed;
    unsigned int k1 = (unsigned int)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned long long p0 = 0xD2511F53ull * (unsigned long long)c0;
        unsigned long long p1 = 0xCD9E8D57ull * (unsigned long long)c2;
        unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0;
        unsigned int n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (unsigned int)p1;
        c2 = n2;
        c3 = (unsigned int)p0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

// Value n of the stream (seed, offset): output n mod 4 of block offset + n/4.
__device__ static unsigned int xpu_philox_value(unsigned long long seed, unsigned long long offset, unsigned long long n) {
    unsigned int out[4];
    xpu_philox(seed, offset + n / 4ull, out);
    return out[n % 4ull];
}

// The top 24 bits times 2^-24 (exact in float).
__device__ static float xpu_uniform(unsigned int bits) {
    return (float)(bits >> 8u) * (1.0f / 16777216.0f);
}

// Random bits into the i32 tensor 0; word[0] seed, word[1] offset.
extern "C" __global__ void xpu_op_random_bits(XpuOpParams p) {
    unsigned int* y = (unsigned int*)p.ptr[0];
    XPU_FOR(e, p.size[0]) {
        y[xpu_off(p, 0, e)] = xpu_philox_value(p.word[0], p.word[1], e);
    }
}

// Gather (bit copies of the storage type): tensors table, indices, out; size[0] the
// number of indices, size[1] the row length.
extern "C" __global__ void xpu_op_gather(XpuOpParams p) {
    if (xpu_rejected(p)) {
        return;
    }
    const xpu_s* table = (const xpu_s*)p.ptr[0];
    const int* idx = (const int*)p.ptr[1];
    xpu_s* out = (xpu_s*)p.ptr[2];
    unsigned long long dim = p.size[1];
    XPU_FOR(e, p.size[0] * dim) {
        unsigned long long i = e / dim;
        unsigned long long j = e % dim;
        unsigned long long row = (unsigned long long)idx[i * p.strides[1][0]];
        out[xpu_off2(p, 2, i, j)] = table[xpu_off2(p, 0, row, j)];
    }
}
