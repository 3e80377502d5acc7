// Scatter-add for f32 and f64 (atomicAdd on the storage type): tensors src, indices,
// table; size[0] the number of indices, size[1] the row length.
extern "C" __global__ void xpu_op_scatter_add(XpuOpParams p) {
    if (xpu_rejected(p)) {
        return;
    }
    const xpu_s* src = (const xpu_s*)p.ptr[0];
    const int* idx = (const int*)p.ptr[1];
    xpu_s* table = (xpu_s*)p.ptr[2];
    unsigned long long dim = p.size[1];
    XPU_FOR(e, p.size[0] * dim) {
        unsigned long long i = e / dim;
        unsigned long long j = e % dim;
        unsigned long long row = (unsigned long long)idx[i * p.strides[1][0]];
        atomicAdd(&table[xpu_off2(p, 2, row, j)], src[xpu_off2(p, 0, i, j)]);
    }
}
