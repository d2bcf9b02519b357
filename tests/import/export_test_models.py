#!/usr/bin/env python3
"""Exports the tiny Hugging Face models the import tests use, each with an eager reference (loss
and every parameter's gradient on the example batch, dropout 0), into the directory given.
One process for all of them: torch's import dominates the time."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import export_model  # noqa: E402

MODELS = {
    "gpt2": ("gpt2", "n_layer=2,n_embd=64,n_head=4,vocab_size=512,n_positions=64,resid_pdrop=0,embd_pdrop=0,attn_pdrop=0"),
    "bert": ("bert", "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128,vocab_size=256,"
                     "max_position_embeddings=64,hidden_dropout_prob=0,attention_probs_dropout_prob=0"),
    "t5": ("t5", "num_layers=2,num_decoder_layers=2,d_model=64,num_heads=4,d_kv=16,d_ff=128,vocab_size=256,"
                 "dropout_rate=0,pad_token_id=0"),
    "llama": ("llama", "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,num_key_value_heads=2,head_dim=128,"
                       "intermediate_size=128,vocab_size=256,max_position_embeddings=64"),
    # Each of these three once measured apart from the replay (docs/benchmarks.md, "Twelve more
    # Hugging Face architectures"): Gemma's type_as of the norm's input, Falcon's transposed
    # weights, GPT-BigCode's attention over a slice of one fused projection.
    "gemma": ("gemma", "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,num_key_value_heads=2,"
                       "intermediate_size=128,vocab_size=256,max_position_embeddings=64,head_dim=16"),
    "falcon": ("falcon", "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,ffn_hidden_size=128,vocab_size=256,"
                         "hidden_dropout=0,attention_dropout=0"),
    "gpt_neox": ("gpt_neox", "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128,vocab_size=256,"
                             "max_position_embeddings=64,hidden_dropout=0,attention_dropout=0"),
    "gpt_bigcode": ("gpt_bigcode", "n_layer=2,n_embd=64,n_head=4,vocab_size=256,n_positions=64,resid_pdrop=0,embd_pdrop=0,"
                                   "attn_pdrop=0"),
    # GPT-J's attention multiplies by its value as a permuted view (a stage receiving it lays it
    # out so again, and the matmul copies it there too); Mixtral routes tokens to experts.
    "gptj": ("gptj", "n_layer=2,n_embd=64,n_head=4,vocab_size=256,n_positions=64,rotary_dim=8,resid_pdrop=0,embd_pdrop=0,"
                     "attn_pdrop=0"),
    "mixtral": ("mixtral", "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128,vocab_size=256,"
                           "max_position_embeddings=64,num_key_value_heads=2,num_local_experts=4,num_experts_per_tok=2"),
    # CodeGen's value is a slice of one fused projection, transposed into heads.
    "codegen": ("codegen", "n_layer=2,n_embd=64,n_head=4,vocab_size=256,n_positions=64,rotary_dim=8,n_inner=128,"
                           "resid_pdrop=0,embd_pdrop=0,attn_pdrop=0"),
    # Cohere's interleaved rotary stacks its halves: the stack's gradient is handed out as views.
    "cohere": ("cohere", "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128,vocab_size=256,"
                         "max_position_embeddings=64,num_key_value_heads=2"),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    import torch

    torch.set_num_threads(1)
    for name, (arch, config) in MODELS.items():
        export_model.main(["--hf", arch, "--config", config, "--seq-len", "16", "--batch-size", "3",
                           "--out", os.path.join(out, name + ".dpm"), "--reference", os.path.join(out, name + ".ref")])
    # The LM head fused with its loss (20 positions at a time: 45 or 48 positions, 3 chunks).
    for name in ("gpt2", "bert", "t5"):
        arch, config = MODELS[name]
        export_model.main(["--hf", arch, "--config", config, "--seq-len", "16", "--batch-size", "3",
                           "--loss-chunk-tokens", "20", "--out", os.path.join(out, name + "_fused.dpm"),
                           "--reference", os.path.join(out, name + "_fused.ref")])
    # The output projection as 3 projections over vocabulary ranges (GPT-2's tied to the
    # embedding, BERT's with a bias), so that cuts can fall between them.
    for name in ("gpt2", "bert"):
        arch, config = MODELS[name]
        export_model.main(["--hf", arch, "--config", config, "--seq-len", "16", "--batch-size", "3",
                           "--output-chunks", "3", "--out", os.path.join(out, name + "_chunked.dpm"),
                           "--reference", os.path.join(out, name + "_chunked.ref")])
    gpt2 = MODELS["gpt2"][1]
    export_model.main(["--hf", "gpt2", "--config", gpt2, "--seq-len", "16", "--batch-size", "3", "--precision", "bf16",
                       "--out", os.path.join(out, "gpt2_bf16.dpm"), "--reference", os.path.join(out, "gpt2_bf16.ref")])
    # GPT-2 with attention dropout: on CPU its attention takes the math path, several autograd
    # functions in one node, whose saved tensors a split backward's I keeps to its end
    # (docs/benchmarks.md, "Split backward and interleaved"). Sequence 64, so that the attention
    # scores I keeps outweigh what else the node's backward allocates. No reference: it draws masks.
    export_model.main(["--hf", "gpt2", "--config", gpt2.replace("attn_pdrop=0", "attn_pdrop=0.1"), "--seq-len", "64",
                       "--batch-size", "3", "--out", os.path.join(out, "gpt2_dropout.dpm")])
    # OPT with its dropout: the residual's gradient reaches its first layer norm as a view of the
    # reshaped one, and autograd sums into a view out of place (docs/benchmarks.md, "the same
    # four under a memory cap"). No reference: it draws masks.
    export_model.main(["--hf", "opt", "--config", "num_hidden_layers=2,hidden_size=64,num_attention_heads=4,ffn_dim=128,"
                       "vocab_size=256,max_position_embeddings=64,word_embed_proj_dim=64", "--seq-len", "16",
                       "--batch-size", "3", "--out", os.path.join(out, "opt.dpm")])
    export_model.main(["--module", "odd_model:build", "--path", os.path.dirname(os.path.abspath(__file__)),
                       "--out", os.path.join(out, "odd.dpm"), "--reference", os.path.join(out, "odd.ref")])


if __name__ == "__main__":
    main()
