"""Write a tiny llama-architecture GGUF: 2 layers, random weights, a real tokenizer, a chat template.

Run with a python that has numpy and gguf (tests/real/llamacpp_build.tool_python):

    python make_tiny_gguf.py VOCAB_GGUF OUT_GGUF

The tokenizer is copied whole from one of llama.cpp's vocab-only GGUF files
(models/ggml-vocab-*.gguf in its sources), so prompts tokenize as a real
model's would; the weights are random (seeded), so the answers are noise, but
every token is really computed, counted and cached by llama-server.
"""

import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

N_EMBD, N_HEAD, N_FF, N_LAYER, N_CTX_TRAIN = 64, 4, 128, 2, 4096
# ChatML: llama.cpp recognizes it (<|im_start|>) without --jinja.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def copy_tokenizer(reader, writer):
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), kind, sub_type=field.types[1])
        else:
            writer.add_key_value(name, field.contents(), kind)
    return len(reader.fields["tokenizer.ggml.tokens"].contents())


def add_weights(writer, n_vocab, rng):
    def weight(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    for layer in range(N_LAYER):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", ones)
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{prefix}.{part}.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", ones)
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD))


def main(vocab_path, out_path):
    reader = GGUFReader(vocab_path)
    writer = GGUFWriter(out_path, "llama")
    writer.add_name("openrelay-tiny-llama")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all F32
    n_vocab = copy_tokenizer(reader, writer)
    writer.add_vocab_size(n_vocab)
    writer.add_chat_template(CHAT_TEMPLATE)
    add_weights(writer, n_vocab, np.random.default_rng(22))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
