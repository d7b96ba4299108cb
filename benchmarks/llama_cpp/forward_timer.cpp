// llama.cpp's side of benchmarks/llama_cpp_side_by_side.py, against libllama alone (no llama-common:
// building that and the tools took longer than this machine had; see BENCHMARKS.md).
//   forward_timer quantize IN.gguf OUT.gguf FTYPE   (llama_model_quantize, 1 thread: 2 = Q4_0, 7 = Q8_0, 32 = BF16)
//   forward_timer time MODEL.gguf POSITIONS REPEATS  (one line per forward: "cpu_ms wall_ms checksum")
//   forward_timer logits MODEL.gguf POSITIONS OUT     (one forward's logits, float32 [POSITIONS, vocab], into OUT)
// A forward is what llama.cpp's diffusion example runs per step: one llama_decode of the whole
// canvas with logits requested at every position, 1 thread.
#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

static double cpu_ms() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static double wall_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static int quantize(const char * in, const char * out, int ftype) {
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.ftype = (llama_ftype) ftype;
    params.nthread = 1;
    return (int) llama_model_quantize(in, out, &params);
}

// One model, a context for one canvas of n positions and the batch of that canvas: token i is
// 3 + (i * 7919) % (n_vocab - 3) (benchmarks/llama_cpp_side_by_side.py feeds caidllm the same),
// logits requested at every position.
struct Canvas {
    llama_model * model = nullptr;
    llama_context * ctx = nullptr;
    llama_batch batch{};
    int n = 0, n_vocab = 0;

    bool open(const char * path, int positions) {
        n = positions;
        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers = 0;
        model = llama_model_load_from_file(path, mp);
        if (!model) { fprintf(stderr, "cannot load %s\n", path); return false; }
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = n; cp.n_batch = n; cp.n_ubatch = n; cp.n_threads = 1; cp.n_threads_batch = 1; cp.no_perf = true;
        ctx = llama_init_from_model(model, cp);
        if (!ctx) { fprintf(stderr, "cannot make a context\n"); return false; }
        n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
        batch = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            batch.token[i] = 3 + (i * 7919) % (n_vocab - 3);
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n;
        return true;
    }

    const float * forward() {
        llama_memory_t mem = llama_get_memory(ctx);
        if (mem) llama_memory_clear(mem, true);
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "llama_decode failed\n"); return nullptr; }
        return llama_get_logits(ctx);
    }

    ~Canvas() {
        if (ctx) { llama_batch_free(batch); llama_free(ctx); }
        if (model) llama_model_free(model);
    }
};

static int time_forwards(const char * path, int n, int repeats) {
    Canvas canvas;
    if (!canvas.open(path, n)) return 1;
    for (int r = 0; r <= repeats; r++) {  // the first: a warm-up
        double c = cpu_ms(), w = wall_ms();
        const float * logits = canvas.forward();
        if (!logits) return 1;
        double checksum = logits[0] + logits[(size_t) n * canvas.n_vocab - 1];
        c = cpu_ms() - c; w = wall_ms() - w;
        if (r > 0) printf("%.2f %.2f %g\n", c, w, checksum);
        fflush(stdout);
    }
    return 0;
}

// The logits of one forward of the canvas, float32 [n, n_vocab] row-major, into `out`.
static int write_logits(const char * path, int n, const char * out) {
    Canvas canvas;
    if (!canvas.open(path, n)) return 1;
    const float * logits = canvas.forward();
    if (!logits) return 1;
    FILE * f = fopen(out, "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", out); return 1; }
    size_t count = (size_t) n * canvas.n_vocab;
    bool ok = fwrite(logits, sizeof(float), count, f) == count;
    ok = (fclose(f) == 0) && ok;
    printf("%d %d\n", n, canvas.n_vocab);
    return ok ? 0 : 1;
}

int main(int argc, char ** argv) {
    if (argc == 5 && !strcmp(argv[1], "quantize")) {
        llama_backend_init();
        return quantize(argv[2], argv[3], atoi(argv[4]));
    }
    if (argc == 5 && !strcmp(argv[1], "time")) {
        llama_backend_init();
        llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
        return time_forwards(argv[2], atoi(argv[3]), atoi(argv[4]));
    }
    if (argc == 5 && !strcmp(argv[1], "logits")) {
        llama_backend_init();
        llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
        return write_logits(argv[2], atoi(argv[3]), argv[4]);
    }
    fprintf(stderr, "usage: %s quantize IN OUT FTYPE | time MODEL POSITIONS REPEATS | logits MODEL POSITIONS OUT\n", argv[0]);
    return 2;
}
