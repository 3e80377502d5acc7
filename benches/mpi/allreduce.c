/* MPI_Allreduce timed the way `xpu bench collectives` times all-reduce: for each size,
 * warm-up iterations, then ITERS iterations back to back (mean per iteration), then
 * ITERS iterations each between barriers (p50). float sum; results checked against the
 * exact sum. Prints one JSON object per size:
 *   {"size": B, "time_us": T, "p50_us": P, "wrong": W}
 *
 *   mpirun -np 2 ./allreduce MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 6) {
    if (rank == 0) fprintf(stderr, "usage: allreduce MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP\n");
    MPI_Finalize();
    return 2;
  }
  long min = atol(argv[1]), max = atol(argv[2]), factor = atol(argv[3]);
  int iters = atoi(argv[4]), warmup = atoi(argv[5]);
  if (min < 4 || max < min || factor < 2 || iters < 1) {
    if (rank == 0) fprintf(stderr, "allreduce: bad arguments\n");
    MPI_Finalize();
    return 2;
  }
  float *send = malloc(max), *recv = malloc(max);
  double *samples = malloc(sizeof(double) * iters);
  if (!send || !recv || !samples) {
    fprintf(stderr, "allreduce: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (long size = min;; size *= factor) {
    if (size > max) size = max;
    long count = size / 4;
    for (long i = 0; i < count; i++) send[i] = (float)((i * 5 + rank * 3) % 7) - 3.0f;
    for (int i = 0; i < warmup; i++)
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double mean = (MPI_Wtime() - t0) / iters;
    for (int i = 0; i < iters; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t = MPI_Wtime();
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      samples[i] = MPI_Wtime() - t;
    }
    qsort(samples, iters, sizeof(double), cmp);
    long wrong = 0;
    for (long i = 0; i < count; i++) {
      float want = 0;
      for (int r = 0; r < n; r++) want += (float)((i * 5 + r * 3) % 7) - 3.0f;
      if (recv[i] != want) wrong++;
    }
    double worst_mean;
    MPI_Reduce(&mean, &worst_mean, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
      printf("{\"size\": %ld, \"time_us\": %.3f, \"p50_us\": %.3f, \"wrong\": %ld}\n", size,
             worst_mean * 1e6, samples[iters / 2] * 1e6, wrong);
    fflush(stdout);
    if (size >= max) break;
  }
  free(send);
  free(recv);
  free(samples);
  MPI_Finalize();
  return 0;
}
