// Test fixture (tests/test_allreduce.py), not product code: the all-reduce loop gen wrote before
// issue 32 (bapipe::ring_allreduce at 80ebb95): one pipelined loop that, every trip, writes one
// sum to tx and reads one from rx with no dependence between the two, so Vitis HLS may schedule
// the read first. -DREAD_FIRST puts the read first (that schedule), else the write first (the
// C order csim used to run). R (2 or 4) replicas in a ring of bounded streams of depth 2, N sums each.
#include <cstdio>

#include "bapipe_csim.h"
#include "hls_stream.h"

#ifndef R
#define R 2
#endif
#define N 64

struct word_t {
    long long v;
};

static void ring_allreduce(hls::stream<word_t> &rx, hls::stream<word_t> &tx, long long *g, int rank) {
    const int C = (N + R - 1) / R;
    BAPIPE_LOOP("old.ring", 1, 3);
    for (long t = 0; t < 2L * (R - 1) * C; t++) {
        BAPIPE_TRIP("old.ring");
        const int step = (int)(t / C), e = (int)(t % C);
        const bool gather = step >= R - 1;
        const int s = gather ? step - (R - 1) : step;
        const int send = ((gather ? rank + 1 - s : rank - s) % R + R) % R;
        const int recv = ((gather ? rank - s : rank - s - 1) % R + R) % R;
        const int i = send * C + e, j = recv * C + e;
        word_t o;
        o.v = i < N ? g[i] : 0;
#ifdef READ_FIRST
        const word_t in = rx.read();
        tx.write(o);
#else
        tx.write(o);
        const word_t in = rx.read();
#endif
        if (j < N) g[j] = gather ? in.v : g[j] + in.v;
    }
}

int main() {
    static long long g[R][N];
    static hls::stream<word_t, 2> ring0("ring0"), ring1("ring1"), ring2("ring2"), ring3("ring3");
    for (int r = 0; r < R; r++)
        for (int i = 0; i < N; i++) g[r][i] = 1000 * r + i;
    BAPIPE_DATAFLOW_BEGIN
#if R == 2
    BAPIPE_PROCESS(ring_allreduce(ring0, ring1, g[0], 0));
    BAPIPE_PROCESS(ring_allreduce(ring1, ring0, g[1], 1));
#else
    BAPIPE_PROCESS(ring_allreduce(ring0, ring1, g[0], 0));
    BAPIPE_PROCESS(ring_allreduce(ring1, ring2, g[1], 1));
    BAPIPE_PROCESS(ring_allreduce(ring2, ring3, g[2], 2));
    BAPIPE_PROCESS(ring_allreduce(ring3, ring0, g[3], 3));
#endif
    BAPIPE_DATAFLOW_END
    long bad = 0;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < N; i++) bad += g[r][i] != (long long)R * i + 1000LL * R * (R - 1) / 2;
    std::printf("%s: %ld sums differ from the total\n", bad ? "FAIL" : "PASS", bad);
    return bad ? 1 : 0;
}
