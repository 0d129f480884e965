// llama.cpp as a reference for the GGUF test models: for each request line on stdin it prints
// one line on stdout.
//   "L id id ..."  the logits after that prompt (fresh cache, one batch), every vocabulary entry
//   "P id"         the token's text as llama.cpp renders it (specials as nothing), in hex
//   "T a s n"      then n bytes of text: the ids llama.cpp's tokenizer gives it; `a` 1 adds the
//                  model's BOS (where its metadata asks for one), `s` 1 reads special tokens
// Built and driven by gen_llama_cpp_refs.py against a llama.cpp build outside the repo.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void)level;
    (void)text;
    (void)data;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s model.gguf < requests\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    static char line[1 << 16];
    static llama_token ids[4096];
    while (fgets(line, sizeof line, stdin)) {
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n') line[--len] = 0;
        if (line[0] == 'T' && line[1] == ' ' && len >= 7) {
            static char text[1 << 16];
            long bytes = strtol(line + 6, NULL, 10);
            if (bytes < 0 || bytes >= (long)sizeof text || fread(text, 1, (size_t)bytes, stdin) != (size_t)bytes) return 2;
            int n = llama_tokenize(vocab, text, (int)bytes, ids, 4096, line[2] == '1', line[4] == '1');
            if (n < 0) return 1;
            for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
        } else if (line[0] == 'P' && line[1] == ' ') {
            char piece[256];
            int n = llama_token_to_piece(vocab, (llama_token)atoi(line + 2), piece, sizeof piece, 0, false);
            for (int i = 0; i < n; i++) printf("%02x", (unsigned char)piece[i]);
            printf("\n");
        } else if (line[0] == 'L' && line[1] == ' ') {
            int n = 0;
            for (char *p = line + 2, *end; *p && n < 4096; p = end) {
                long v = strtol(p, &end, 10);
                if (end == p) break;
                ids[n++] = (llama_token)v;
            }
            llama_memory_clear(llama_get_memory(ctx), true);
            if (n == 0 || llama_decode(ctx, llama_batch_get_one(ids, n)) != 0) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
            const float *logits = llama_get_logits_ith(ctx, -1);
            for (int i = 0; i < n_vocab; i++) printf(i ? " %.9g" : "%.9g", logits[i]);
            printf("\n");
        } else {
            fprintf(stderr, "bad request\n");
            return 2;
        }
        fflush(stdout);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
