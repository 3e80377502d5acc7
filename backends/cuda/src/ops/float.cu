// The float standard operations (after common.cu and a float prelude, which also
// defines xpu_exp, xpu_log, xpu_sqrt, xpu_tanh, xpu_neg_inf and xpu_pos_inf on xpu_w,
// xpu_ld / xpu_st to read and write a storage element as xpu_w, and xpu_st_d to round a
// double once to the storage type). Tensor numbers follow the operation's operands.

// a or b when either is NaN (so NaN propagates), else the larger / smaller.
__device__ static xpu_w xpu_nanmax(xpu_w a, xpu_w b) {
    if (a != a || b != b) {
        return a + b;
    }
    return a > b ? a : b;
}

__device__ static xpu_w xpu_nanmin(xpu_w a, xpu_w b) {
    if (a != a || b != b) {
        return a + b;
    }
    return a < b ? a : b;
}

// Block-wide sum and maximum (blockDim.x == XPU_BLOCK); every thread gets the result.
__device__ static xpu_w xpu_block_sum(xpu_w v, xpu_w* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = XPU_BLOCK / 2u; s > 0u; s >>= 1u) {
        if (threadIdx.x < s) {
            sh[threadIdx.x] += sh[threadIdx.x + s];
        }
        __syncthreads();
    }
    xpu_w r = sh[0];
    __syncthreads();
    return r;
}

__device__ static xpu_w xpu_block_max(xpu_w v, xpu_w* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = XPU_BLOCK / 2u; s > 0u; s >>= 1u) {
        if (threadIdx.x < s) {
            sh[threadIdx.x] = xpu_nanmax(sh[threadIdx.x], sh[threadIdx.x + s]);
        }
        __syncthreads();
    }
    xpu_w r = sh[0];
    __syncthreads();
    return r;
}

#define XPU_TILE 16

// c = alpha op(a) op(b) + beta c: tensors a, b, c; size m, n, k, batch; word[0], word[1]
// trans_a, trans_b; f[0] alpha, f[1] beta (c is not read when beta is 0). 16x16 tiles
// in shared memory, one 256-thread block per tile of c, grid-stride over tiles and
// batches.
extern "C" __global__ void xpu_op_matmul(XpuOpParams p) {
    __shared__ xpu_w ta[XPU_TILE][XPU_TILE];
    __shared__ xpu_w tb[XPU_TILE][XPU_TILE];
    const xpu_s* a = (const xpu_s*)p.ptr[0];
    const xpu_s* b = (const xpu_s*)p.ptr[1];
    xpu_s* c = (xpu_s*)p.ptr[2];
    unsigned long long m = p.size[0];
    unsigned long long n = p.size[1];
    unsigned long long k = p.size[2];
    unsigned long long batch = p.size[3];
    int r = (int)p.rank[2];
    unsigned long long a_i = p.word[0] != 0ull ? p.strides[0][r - 1] : p.strides[0][r - 2];
    unsigned long long a_q = p.word[0] != 0ull ? p.strides[0][r - 2] : p.strides[0][r - 1];
    unsigned long long b_q = p.word[1] != 0ull ? p.strides[1][r - 1] : p.strides[1][r - 2];
    unsigned long long b_j = p.word[1] != 0ull ? p.strides[1][r - 2] : p.strides[1][r - 1];
    unsigned long long a_z = r == 3 ? p.strides[0][0] : 0ull;
    unsigned long long b_z = r == 3 ? p.strides[1][0] : 0ull;
    unsigned long long c_z = r == 3 ? p.strides[2][0] : 0ull;
    unsigned int tx = threadIdx.x % XPU_TILE;
    unsigned int ty = threadIdx.x / XPU_TILE;
    xpu_w alpha = (xpu_w)p.f[0];
    xpu_w beta = (xpu_w)p.f[1];
    for (unsigned long long z = blockIdx.z; z < batch; z += gridDim.z) {
        for (unsigned long long by = blockIdx.y; by * XPU_TILE < m; by += gridDim.y) {
            for (unsigned long long bx = blockIdx.x; bx * XPU_TILE < n; bx += gridDim.x) {
                unsigned long long i = by * XPU_TILE + ty;
                unsigned long long j = bx * XPU_TILE + tx;
                xpu_w sum = (xpu_w)0;
                for (unsigned long long q0 = 0ull; q0 < k; q0 += XPU_TILE) {
                    unsigned long long qa = q0 + tx;
                    unsigned long long qb = q0 + ty;
                    ta[ty][tx] = (i < m && qa < k) ? xpu_ld(a, z * a_z + i * a_i + qa * a_q) : (xpu_w)0;
                    tb[ty][tx] = (qb < k && j < n) ? xpu_ld(b, z * b_z + qb * b_q + j * b_j) : (xpu_w)0;
                    __syncthreads();
                    for (int q = 0; q < XPU_TILE; q++) {
                        sum += ta[ty][q] * tb[q][tx];
                    }
                    __syncthreads();
                }
                if (i < m && j < n) {
                    unsigned long long o = z * c_z + i * p.strides[2][r - 2] + j * p.strides[2][r - 1];
                    xpu_w v = alpha * sum;
                    if (p.f[1] != 0.0f) {
                        v += beta * xpu_ld(c, o);
                    }
                    xpu_st(c, o, v);
                }
            }
        }
    }
}

// y = x + bias per row: tensors x, bias, y; size rows, n.
extern "C" __global__ void xpu_op_bias_add(XpuOpParams p) {
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    const xpu_s* bias = (const xpu_s*)p.ptr[1];
    xpu_s* y = (xpu_s*)p.ptr[2];
    unsigned long long n = p.size[1];
    XPU_FOR(e, p.size[0] * n) {
        unsigned long long r = e / n;
        unsigned long long j = e % n;
        xpu_st(y, xpu_off2(p, 2, r, j), xpu_ld(x, xpu_off2(p, 0, r, j)) + xpu_ld(bias, j * p.strides[1][0]));
    }
}

// Elementwise: size[0] elements.
extern "C" __global__ void xpu_op_relu(XpuOpParams p) {
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    xpu_s* y = (xpu_s*)p.ptr[1];
    XPU_FOR(e, p.size[0]) {
        xpu_w v = xpu_ld(x, xpu_off(p, 0, e));
        xpu_st(y, xpu_off(p, 1, e), (v > (xpu_w)0 || v != v) ? v : (xpu_w)0);
    }
}

extern "C" __global__ void xpu_op_relu_backward(XpuOpParams p) {
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    const xpu_s* dy = (const xpu_s*)p.ptr[1];
    xpu_s* dx = (xpu_s*)p.ptr[2];
    XPU_FOR(e, p.size[0]) {
        xpu_w v = xpu_ld(x, xpu_off(p, 0, e));
        xpu_w g = xpu_ld(dy, xpu_off(p, 1, e));
        xpu_st(dx, xpu_off(p, 2, e), v > (xpu_w)0 ? g : (xpu_w)0);
    }
}

#define XPU_GELU_C ((xpu_w)0.7978845608028654)
#define XPU_GELU_A ((xpu_w)0.044715)

extern "C" __global__ void xpu_op_gelu(XpuOpParams p) {
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    xpu_s* y = (xpu_s*)p.ptr[1];
    XPU_FOR(e, p.size[0]) {
        xpu_w v = xpu_ld(x, xpu_off(p, 0, e));
        xpu_w t = xpu_tanh(XPU_GELU_C * (v + XPU_GELU_A * v * v * v));
        xpu_st(y, xpu_off(p, 1, e), (xpu_w)0.5 * v * ((xpu_w)1 + t));
    }
}

extern "C" __global__ void xpu_op_gelu_backward(XpuOpParams p) {
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    const xpu_s* dy = (const xpu_s*)p.ptr[1];
    xpu_s* dx = (xpu_s*)p.ptr[2];
    XPU_FOR(e, p.size[0]) {
        xpu_w v = xpu_ld(x, xpu_off(p, 0, e));
        xpu_w g = xpu_ld(dy, xpu_off(p, 1, e));
        xpu_w t = xpu_tanh(XPU_GELU_C * (v + XPU_GELU_A * v * v * v));
        xpu_w d = (xpu_w)0.5 * ((xpu_w)1 + t)
            + (xpu_w)0.5 * v * ((xpu_w)1 - t * t) * XPU_GELU_C * ((xpu_w)1 + (xpu_w)3 * XPU_GELU_A * v * v);
        xpu_st(dx, xpu_off(p, 2, e), g * d);
    }
}

// Row operations: one block per row (grid-stride over rows); size rows, n.
extern "C" __global__ void xpu_op_softmax(XpuOpParams p) {
    __shared__ xpu_w sh[XPU_BLOCK];
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    xpu_s* y = (xpu_s*)p.ptr[1];
    unsigned long long n = p.size[1];
    for (unsigned long long r = blockIdx.x; r < p.size[0]; r += gridDim.x) {
        xpu_w mx = xpu_neg_inf();
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            mx = xpu_nanmax(mx, xpu_ld(x, xpu_off2(p, 0, r, j)));
        }
        mx = xpu_block_max(mx, sh);
        xpu_w s = (xpu_w)0;
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            s += xpu_exp(xpu_ld(x, xpu_off2(p, 0, r, j)) - mx);
        }
        s = xpu_block_sum(s, sh);
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            xpu_st(y, xpu_off2(p, 1, r, j), xpu_exp(xpu_ld(x, xpu_off2(p, 0, r, j)) - mx) / s);
        }
    }
}

extern "C" __global__ void xpu_op_softmax_backward(XpuOpParams p) {
    __shared__ xpu_w sh[XPU_BLOCK];
    const xpu_s* y = (const xpu_s*)p.ptr[0];
    const xpu_s* dy = (const xpu_s*)p.ptr[1];
    xpu_s* dx = (xpu_s*)p.ptr[2];
    unsigned long long n = p.size[1];
    for (unsigned long long r = blockIdx.x; r < p.size[0]; r += gridDim.x) {
        xpu_w dot = (xpu_w)0;
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            dot += xpu_ld(y, xpu_off2(p, 0, r, j)) * xpu_ld(dy, xpu_off2(p, 1, r, j));
        }
        dot = xpu_block_sum(dot, sh);
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            xpu_w v = xpu_ld(y, xpu_off2(p, 0, r, j));
            xpu_st(dx, xpu_off2(p, 2, r, j), v * (xpu_ld(dy, xpu_off2(p, 1, r, j)) - dot));
        }
    }
}

// The row's maximum and log-sum-exp (infinite when the maximum is).
__device__ static void xpu_row_lse(const XpuOpParams& p, const xpu_s* x, unsigned long long r, xpu_w* sh, xpu_w* mx_out, xpu_w* lse_out) {
    unsigned long long n = p.size[1];
    xpu_w mx = xpu_neg_inf();
    for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
        mx = xpu_nanmax(mx, xpu_ld(x, xpu_off2(p, 0, r, j)));
    }
    mx = xpu_block_max(mx, sh);
    xpu_w s = (xpu_w)0;
    for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
        s += xpu_exp(xpu_ld(x, xpu_off2(p, 0, r, j)) - mx);
    }
    s = xpu_block_sum(s, sh);
    *mx_out = mx;
    *lse_out = mx == xpu_pos_inf() ? mx : mx + xpu_log(s);
}

// Cross-entropy: tensors logits, labels (i32), loss; size rows, classes.
extern "C" __global__ void xpu_op_cross_entropy(XpuOpParams p) {
    __shared__ xpu_w sh[XPU_BLOCK];
    if (xpu_rejected(p)) {
        return;
    }
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    const int* labels = (const int*)p.ptr[1];
    xpu_s* loss = (xpu_s*)p.ptr[2];
    for (unsigned long long r = blockIdx.x; r < p.size[0]; r += gridDim.x) {
        int label = labels[r * p.strides[1][0]];
        unsigned long long o = r * p.strides[2][0];
        if (label < 0) {
            if (threadIdx.x == 0u) {
                xpu_st(loss, o, (xpu_w)0);
            }
            continue;
        }
        xpu_w mx;
        xpu_w lse;
        xpu_row_lse(p, x, r, sh, &mx, &lse);
        if (threadIdx.x == 0u) {
            xpu_st(loss, o, lse - xpu_ld(x, xpu_off2(p, 0, r, (unsigned long long)label)));
        }
    }
}

// Its gradient: tensors logits, labels, dloss, dlogits.
extern "C" __global__ void xpu_op_cross_entropy_backward(XpuOpParams p) {
    __shared__ xpu_w sh[XPU_BLOCK];
    if (xpu_rejected(p)) {
        return;
    }
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    const int* labels = (const int*)p.ptr[1];
    const xpu_s* dloss = (const xpu_s*)p.ptr[2];
    xpu_s* dx = (xpu_s*)p.ptr[3];
    unsigned long long n = p.size[1];
    for (unsigned long long r = blockIdx.x; r < p.size[0]; r += gridDim.x) {
        int label = labels[r * p.strides[1][0]];
        if (label < 0) {
            for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
                xpu_st(dx, xpu_off2(p, 3, r, j), (xpu_w)0);
            }
            continue;
        }
        xpu_w mx = xpu_neg_inf();
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            mx = xpu_nanmax(mx, xpu_ld(x, xpu_off2(p, 0, r, j)));
        }
        mx = xpu_block_max(mx, sh);
        xpu_w s = (xpu_w)0;
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            s += xpu_exp(xpu_ld(x, xpu_off2(p, 0, r, j)) - mx);
        }
        s = xpu_block_sum(s, sh);
        xpu_w g = xpu_ld(dloss, r * p.strides[2][0]);
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            xpu_w v = xpu_exp(xpu_ld(x, xpu_off2(p, 0, r, j)) - mx) / s;
            if (j == (unsigned long long)label) {
                v -= (xpu_w)1;
            }
            xpu_st(dx, xpu_off2(p, 3, r, j), v * g);
        }
    }
}

// Layer norm: tensors x, gamma, beta, y, mean, rstd (the statistics are xpu_w); f[0] eps.
extern "C" __global__ void xpu_op_layer_norm(XpuOpParams p) {
    __shared__ xpu_w sh[XPU_BLOCK];
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    const xpu_s* gamma = (const xpu_s*)p.ptr[1];
    const xpu_s* beta = (const xpu_s*)p.ptr[2];
    xpu_s* y = (xpu_s*)p.ptr[3];
    xpu_w* mean = (xpu_w*)p.ptr[4];
    xpu_w* rstd = (xpu_w*)p.ptr[5];
    unsigned long long n = p.size[1];
    for (unsigned long long r = blockIdx.x; r < p.size[0]; r += gridDim.x) {
        xpu_w s = (xpu_w)0;
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            s += xpu_ld(x, xpu_off2(p, 0, r, j));
        }
        xpu_w mu = xpu_block_sum(s, sh) / (xpu_w)n;
        xpu_w q = (xpu_w)0;
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            xpu_w d = xpu_ld(x, xpu_off2(p, 0, r, j)) - mu;
            q += d * d;
        }
        xpu_w var = xpu_block_sum(q, sh) / (xpu_w)n;
        xpu_w rs = (xpu_w)1 / xpu_sqrt(var + (xpu_w)p.f[0]);
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            xpu_w v = (xpu_ld(x, xpu_off2(p, 0, r, j)) - mu) * rs;
            xpu_st(y, xpu_off2(p, 3, r, j), v * xpu_ld(gamma, j * p.strides[1][0]) + xpu_ld(beta, j * p.strides[2][0]));
        }
        if (threadIdx.x == 0u) {
            mean[r * p.strides[4][0]] = mu;
            rstd[r * p.strides[5][0]] = rs;
        }
    }
}

// Layer norm backward, dx per row: tensors x, gamma, mean, rstd, dy, dx, dgamma, dbeta.
extern "C" __global__ void xpu_op_layer_norm_backward_rows(XpuOpParams p) {
    __shared__ xpu_w sh[XPU_BLOCK];
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    const xpu_s* gamma = (const xpu_s*)p.ptr[1];
    const xpu_w* mean = (const xpu_w*)p.ptr[2];
    const xpu_w* rstd = (const xpu_w*)p.ptr[3];
    const xpu_s* dy = (const xpu_s*)p.ptr[4];
    xpu_s* dx = (xpu_s*)p.ptr[5];
    unsigned long long n = p.size[1];
    for (unsigned long long r = blockIdx.x; r < p.size[0]; r += gridDim.x) {
        xpu_w mu = mean[r * p.strides[2][0]];
        xpu_w rs = rstd[r * p.strides[3][0]];
        xpu_w s1 = (xpu_w)0;
        xpu_w s2 = (xpu_w)0;
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            xpu_w xhat = (xpu_ld(x, xpu_off2(p, 0, r, j)) - mu) * rs;
            xpu_w dxhat = xpu_ld(dy, xpu_off2(p, 4, r, j)) * xpu_ld(gamma, j * p.strides[1][0]);
            s1 += dxhat;
            s2 += dxhat * xhat;
        }
        xpu_w m1 = xpu_block_sum(s1, sh) / (xpu_w)n;
        xpu_w m2 = xpu_block_sum(s2, sh) / (xpu_w)n;
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            xpu_w xhat = (xpu_ld(x, xpu_off2(p, 0, r, j)) - mu) * rs;
            xpu_w dxhat = xpu_ld(dy, xpu_off2(p, 4, r, j)) * xpu_ld(gamma, j * p.strides[1][0]);
            xpu_st(dx, xpu_off2(p, 5, r, j), rs * (dxhat - m1 - xhat * m2));
        }
    }
}

// Layer norm backward, dgamma and dbeta: one thread per column, summing over the rows.
extern "C" __global__ void xpu_op_layer_norm_backward_params(XpuOpParams p) {
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    const xpu_w* mean = (const xpu_w*)p.ptr[2];
    const xpu_w* rstd = (const xpu_w*)p.ptr[3];
    const xpu_s* dy = (const xpu_s*)p.ptr[4];
    xpu_s* dgamma = (xpu_s*)p.ptr[6];
    xpu_s* dbeta = (xpu_s*)p.ptr[7];
    XPU_FOR(j, p.size[1]) {
        xpu_w g = (xpu_w)0;
        xpu_w b = (xpu_w)0;
        for (unsigned long long r = 0ull; r < p.size[0]; r++) {
            xpu_w xhat = (xpu_ld(x, xpu_off2(p, 0, r, j)) - mean[r * p.strides[2][0]]) * rstd[r * p.strides[3][0]];
            xpu_w d = xpu_ld(dy, xpu_off2(p, 4, r, j));
            g += d * xhat;
            b += d;
        }
        xpu_st(dgamma, j * p.strides[6][0], g);
        xpu_st(dbeta, j * p.strides[7][0], b);
    }
}

// Reduce along an axis: tensors x, y; size[0] the axis length, size[1] y's elements;
// word[0] the axis, word[1] the reduction (0 sum, 1 mean, 2 max, 3 min).
extern "C" __global__ void xpu_op_reduce(XpuOpParams p) {
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    xpu_s* y = (xpu_s*)p.ptr[1];
    unsigned long long len = p.size[0];
    unsigned long long step = p.strides[0][p.word[0]];
    unsigned long long kind = p.word[1];
    XPU_FOR(e, p.size[1]) {
        unsigned long long rest = e;
        unsigned long long base = 0ull;
        for (int k = (int)p.rank[1] - 1; k >= 0; k--) {
            unsigned long long d = p.dims[1][k];
            base += (rest % d) * p.strides[0][k];
            rest /= d;
        }
        xpu_w acc = kind == 2ull ? xpu_neg_inf() : (kind == 3ull ? xpu_pos_inf() : (xpu_w)0);
        for (unsigned long long q = 0ull; q < len; q++) {
            xpu_w v = xpu_ld(x, base + q * step);
            if (kind == 2ull) {
                acc = xpu_nanmax(acc, v);
            } else if (kind == 3ull) {
                acc = xpu_nanmin(acc, v);
            } else {
                acc += v;
            }
        }
        if (kind == 1ull) {
            acc = acc / (xpu_w)len;
        }
        xpu_st(y, xpu_off(p, 1, e), acc);
    }
}

// SGD with momentum: tensors param, grad, velocity; f lr, momentum, weight decay;
// word[0] nesterov.
extern "C" __global__ void xpu_op_sgd_momentum(XpuOpParams p) {
    xpu_s* param = (xpu_s*)p.ptr[0];
    const xpu_s* grad = (const xpu_s*)p.ptr[1];
    xpu_s* vel = (xpu_s*)p.ptr[2];
    xpu_w lr = (xpu_w)p.f[0];
    xpu_w mom = (xpu_w)p.f[1];
    xpu_w wd = (xpu_w)p.f[2];
    XPU_FOR(e, p.size[0]) {
        unsigned long long op = xpu_off(p, 0, e);
        unsigned long long ov = xpu_off(p, 2, e);
        xpu_w w = xpu_ld(param, op);
        xpu_w g = xpu_ld(grad, xpu_off(p, 1, e)) + wd * w;
        xpu_w v = mom * xpu_ld(vel, ov) + g;
        xpu_w s = p.word[0] != 0ull ? g + mom * v : v;
        xpu_st(param, op, w - lr * s);
        xpu_st(vel, ov, v);
    }
}

// AdamW: tensors param, grad, m, v; f lr, beta1, beta2, eps, weight decay; word[0] and
// word[1] the bias corrections 1 - beta1^step and 1 - beta2^step as double bits.
extern "C" __global__ void xpu_op_adamw(XpuOpParams p) {
    xpu_s* param = (xpu_s*)p.ptr[0];
    const xpu_s* grad = (const xpu_s*)p.ptr[1];
    xpu_s* m = (xpu_s*)p.ptr[2];
    xpu_s* v = (xpu_s*)p.ptr[3];
    xpu_w lr = (xpu_w)p.f[0];
    xpu_w b1 = (xpu_w)p.f[1];
    xpu_w b2 = (xpu_w)p.f[2];
    xpu_w eps = (xpu_w)p.f[3];
    xpu_w wd = (xpu_w)p.f[4];
    xpu_w c1 = (xpu_w)__longlong_as_double((long long)p.word[0]);
    xpu_w c2 = (xpu_w)__longlong_as_double((long long)p.word[1]);
    XPU_FOR(e, p.size[0]) {
        unsigned long long op = xpu_off(p, 0, e);
        unsigned long long om = xpu_off(p, 2, e);
        unsigned long long ov = xpu_off(p, 3, e);
        xpu_w w = xpu_ld(param, op);
        xpu_w g = xpu_ld(grad, xpu_off(p, 1, e));
        xpu_w mm = b1 * xpu_ld(m, om) + ((xpu_w)1 - b1) * g;
        xpu_w vv = b2 * xpu_ld(v, ov) + ((xpu_w)1 - b2) * g * g;
        xpu_w update = (mm / c1) / (xpu_sqrt(vv / c2) + eps) + wd * w;
        xpu_st(param, op, w - lr * update);
        xpu_st(m, om, mm);
        xpu_st(v, ov, vv);
    }
}

// Random floats into tensor 0: word[0] seed, word[1] offset, word[2] 1 uniform (f[0]
// low, f[1] high) or 2 normal (f[0] mean, f[1] std). Computed in double, rounded once.
extern "C" __global__ void xpu_op_random(XpuOpParams p) {
    xpu_s* y = (xpu_s*)p.ptr[0];
    double lo = (double)p.f[0];
    double hi = (double)p.f[1];
    XPU_FOR(e, p.size[0]) {
        double v;
        if (p.word[2] == 1ull) {
            v = lo + (hi - lo) * (double)xpu_uniform(xpu_philox_value(p.word[0], p.word[1], e));
        } else {
            unsigned int out[4];
            xpu_philox(p.word[0], p.word[1] + e / 4ull, out);
            unsigned int lane = (unsigned int)(e % 4ull);
            unsigned int pair = lane & ~1u;
            double u1 = ((double)(out[pair] >> 8u) + 1.0) / 16777216.0;
            double u2 = (double)(out[pair + 1u] >> 8u) / 16777216.0;
            double radius = sqrt(-2.0 * log(u1));
            double angle = 6.283185307179586 * u2;
            v = lo + hi * ((lane & 1u) == 0u ? radius * cos(angle) : radius * sin(angle));
        }
        xpu_st_d(y, xpu_off(p, 0, e), v);
    }
}

// Inverted dropout: tensors x, y; f[0] p; word[0] seed, word[1] offset, word[2] the
// scale 1/(1-p) as double bits.
extern "C" __global__ void xpu_op_dropout(XpuOpParams p) {
    const xpu_s* x = (const xpu_s*)p.ptr[0];
    xpu_s* y = (xpu_s*)p.ptr[1];
    double scale = __longlong_as_double((long long)p.word[2]);
    XPU_FOR(e, p.size[0]) {
        bool keep = xpu_uniform(xpu_philox_value(p.word[0], p.word[1], e)) >= p.f[0];
        double v = keep ? (double)xpu_ld(x, xpu_off(p, 0, e)) * scale : 0.0;
        xpu_st_d(y, xpu_off(p, 1, e), v);
    }
}
