#!/usr/bin/env python3
"""Turns text files into a DawnPiper token file for `dawnpiper train --data`.

  scripts/python scripts/prepare_data.py --input a.txt b.txt --vocab-size 4096 --out tokens.bin

Writes, each atomically:
  tokens.bin                 the ids, flat, little-endian uint16 (vocabulary <= 65536) or uint32
  tokens.bin.json            metadata: format, dtype, token count, vocabulary size, sources
  tokens.bin.tokenizer.json  the tokenizer (unless --tokenizer gave one)

Without --tokenizer a byte-level BPE of --vocab-size tokens (GPT-2 style; byte fallback, so any
text encodes) is trained on the inputs, offline. Files are separated by an end-of-text token.
Exit status: 0 written, 2 bad input (the message says what to change).
"""
import argparse
import json
import os
import sys

from atomic_file import atomic_write

FORMAT_VERSION = 1
END_OF_TEXT = "<|endoftext|>"


class UserError(Exception):
    pass


def read_texts(paths):
    texts = []
    for p in paths:
        if not os.path.isfile(p):
            raise UserError(f"--input {p}: no such file")
        with open(p, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    return texts


def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise UserError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least 257 tokens (256 bytes + end of text)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True, help="text files (UTF-8)")
    parser.add_argument("--vocab-size", type=int, required=True,
                        help="vocabulary size: of the BPE to train, or the model's (every id must be below it)")
    parser.add_argument("--tokenizer", help="a tokenizer.json to use instead of training one")
    parser.add_argument("--out", required=True, help="token file to write")
    args = parser.parse_args(argv)
    from tokenizers import Tokenizer

    texts = read_texts(args.input)
    if args.tokenizer:
        if not os.path.isfile(args.tokenizer):
            raise UserError(f"--tokenizer {args.tokenizer}: no such file")
        tok = Tokenizer.from_file(args.tokenizer)
    else:
        tok = train_tokenizer(texts, args.vocab_size)
    vocab = tok.get_vocab_size()
    if vocab > args.vocab_size:
        raise UserError(f"the tokenizer has {vocab} tokens, more than --vocab-size {args.vocab_size} "
                        f"(the model could not embed every id)")
    eot = tok.token_to_id(END_OF_TEXT)
    ids = []
    for text in texts:
        ids.extend(tok.encode(text).ids)
        if eot is not None:
            ids.append(eot)
    import numpy as np

    dtype = np.uint16 if args.vocab_size <= 65536 else np.uint32
    array = np.asarray(ids, dtype=dtype)
    if array.size and int(array.max()) >= args.vocab_size:
        raise UserError(f"id {int(array.max())} is not below --vocab-size {args.vocab_size}")
    atomic_write(args.out, lambda tmp: array.astype(array.dtype.newbyteorder("<")).tofile(tmp))
    tokenizer_path = args.tokenizer or args.out + ".tokenizer.json"
    if not args.tokenizer:
        atomic_write(tokenizer_path, lambda tmp: tok.save(tmp))
    meta = {
        "format": "dawnpiper-tokens",
        "version": FORMAT_VERSION,
        "dtype": "uint16" if dtype is np.uint16 else "uint32",
        "tokens": int(array.size),
        "vocab_size": args.vocab_size,
        "tokenizer": os.path.abspath(tokenizer_path),
        "end_of_text": eot,
        "sources": [os.path.abspath(p) for p in args.input],
    }

    def write_meta(tmp):
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1)

    atomic_write(args.out + ".json", write_meta)
    print(f"wrote {args.out}: {array.size} tokens ({meta['dtype']}), vocabulary {vocab} of {args.vocab_size}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"prepare_data.py: {e}", file=sys.stderr)
        sys.exit(2)
