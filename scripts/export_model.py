#!/usr/bin/env python3
"""Exports a PyTorch model to a DawnPiper model file (docs/model-format.md).

The model is captured with torch.export (training IR, functionalized with an empty decomposition
table: in-place ops become functional ones, composite ops such as linear, layer_norm and
scaled_dot_product_attention stay whole) with a dynamic batch dimension, so one file serves every
micro-batch size. The file is a safetensors file: the weights (parameters by their PyTorch names,
buffers, constants) and, in its metadata, the graph as JSON.

Sources:
  --hf gpt2 --config n_layer=2,n_embd=128      a Hugging Face transformers architecture from a
  --hf-config path/config.json                 config (no hub access needed); --pretrained DIR
                                               loads a local save_pretrained() directory instead
  --module my_pkg.models:build                 a function returning (model, inputs, loss[, roles])

Run it with scripts/python (the project's environment). Exit status: 0 written, 2 bad input
(the message says what to change), 1 anything else.
"""
import argparse
import importlib
import inspect
import json
import logging
import math
import os
import sys
import tempfile
import warnings

# Noise torch and transformers print on import and export that says nothing about the model.
def quiet_torch_logs():
    """torch configures its loggers on import: quiet them afterwards."""
    for name in ("torch.utils.flop_counter", "torch.fx.experimental.symbolic_shapes", "torch._export",
                 "torch.export", "torch._dynamo"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
warnings.filterwarnings("ignore", category=FutureWarning)
import traceback

from atomic_file import atomic_write

FORMAT_VERSION = 1
VERBOSE = False


class UserError(Exception):
    """Something the user can fix; printed as one line, exit status 2."""


# ----------------------------------------------------------------------------- sources


def autocast(precision):
    """bf16: torch.autocast, recorded by torch.export as explicit casts (bf16 matmuls, fp32
    parameters: the master weights); fp32: nothing."""
    import contextlib

    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def parse_overrides(text):
    """'n_layer=2,n_embd=128,act=gelu' -> dict with ints, floats, bools and strings."""
    out = {}
    if not text:
        return out
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise UserError(f"--config: '{item}' is not key=value")
        key, value = (s.strip() for s in item.split("=", 1))
        for convert in (int, float):
            try:
                out[key] = convert(value)
                break
            except ValueError:
                pass
        else:
            out[key] = {"true": True, "false": False, "none": None}.get(value.lower(), value)
    return out


def first_line(e):
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    return (lines[0] if lines else type(e).__name__)[:400]


# Settings transformers takes as config keyword arguments but keeps out of the config's fields.
IMPLEMENTATION_SETTINGS = ("experts_implementation", "attn_implementation")
KV_HEAD_SETTINGS = ("num_key_value_heads", "num_kv_heads")
# Settings that give the attention's head size apart from hidden_size / num_attention_heads.
HEAD_SIZE_SETTINGS = ("head_dim", "d_kv", "kv_channels", "attention_head_size", "head_size")


def hf_config(args):
    """The Hugging Face config: the source's values (the architecture's defaults, --hf-config's
    file or --pretrained's), the user's --config overrides, and the values that follow them.

    The config is built with the overrides as constructor arguments, so that what the config
    computes from other values (Llama's num_key_value_heads and head_dim, T5's
    num_decoder_layers, Qwen2's layer_types, GPT-2's n_inner, ...) follows the overrides; a value
    a file holds that the config would compute the same from the file's other values counts as
    computed. Where the architecture's default is a plain number, two relations are kept as well
    (follow_heads). Settings the user gives are never changed; inconsistent ones are a UserError
    naming them."""
    import transformers

    overrides = parse_overrides(args.config)
    if args.pretrained:
        base = transformers.AutoConfig.from_pretrained(args.pretrained, local_files_only=True)
        raw = None  # its values (base.to_dict()) are needed only when there is something to override
    elif args.hf_config:
        path = args.hf_config
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise UserError(f"--hf-config: no such file {path}")
        with open(path) as f:
            raw = json.load(f)
        model_type = raw.pop("model_type", args.hf)
        if not model_type:
            raise UserError(f"{path} has no model_type; give --hf ARCH")
        try:
            base = transformers.AutoConfig.for_model(model_type, **raw)
        except Exception as e:  # noqa: BLE001 - the config's own checks raise many kinds
            raise UserError(f"--hf-config {path}: {first_line(e)}") from e
    else:
        try:
            base = transformers.AutoConfig.for_model(args.hf)
        except ValueError as e:
            raise UserError(f"--hf {args.hf}: not a transformers architecture ({first_line(e)})")
        raw = {}
    cls = type(base)
    aliases = dict(getattr(base, "attribute_map", {}) or {})
    parameters = inspect.signature(cls.__init__).parameters
    known = set(base.to_dict()) | set(aliases) | set(parameters) | set(IMPLEMENTATION_SETTINGS)
    user = {}
    for key, value in overrides.items():
        if key not in known:
            raise UserError(f"--config: {base.model_type} configs have no setting '{key}'")
        key = aliases.get(key, key)  # the config's own name (GPT-2: n_head for num_attention_heads)
        user[key] = float(value) if isinstance(value, int) and float_setting(cls, key) else value
    implementations = {k: user.pop(k) for k in IMPLEMENTATION_SETTINGS if k in user}
    if not user and not implementations:
        check_heads(base, aliases)
        return base
    if raw is None:
        raw = {k: v for k, v in base.to_dict().items() if k not in ("model_type", "transformers_version")}
        for k in IMPLEMENTATION_SETTINGS:  # kept out of to_dict(): carry the source's choice
            if getattr(base, "_" + k, None) is not None:
                raw.setdefault(k, getattr(base, "_" + k))

    def build(values):
        try:
            return cls(**values)
        except Exception as e:  # noqa: BLE001 - the config's own checks raise many kinds
            raise UserError(f"--config: {base.model_type}: {' '.join(str(e).split())[:400]}") from e

    # Values the file holds that the config computes from its other values when unset (their
    # default is None): left out, so that they follow the overrides.
    values = dict(raw)
    for key in list(values):
        p = parameters.get(key)
        if key in user or p is None or p.default is not None or values[key] is None:
            continue
        try:
            if getattr(build({k: v for k, v in values.items() if k != key}), key, None) == values[key]:
                del values[key]
        except UserError:
            pass  # the config needs it
    computed = {k for k, p in parameters.items() if p.default is None and k not in values and k not in user}
    followed, notes = follow_heads(base, user, computed, aliases, parameters)
    values.update(user)
    values.update(followed)
    values.update(implementations)
    config = build(values)
    check_heads(config, aliases)
    if notes:
        print("export_model.py: following --config: " + ", ".join(notes) + "; give them in --config to choose others")
    return config


def float_setting(cls, key):
    """Whether the config declares `key` a float (its checks refuse an int: 'router_jitter_noise=0')."""
    for klass in cls.__mro__:
        annotation = inspect.get_annotations(klass).get(key)
        if annotation is not None:
            text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
            kinds = {t.strip() for t in text.replace("typing.", "").split("|")}
            return "float" in kinds and "int" not in kinds
    return False


def follow_heads(base, user, computed, aliases, parameters):
    """The attention's shapes after the user's overrides, checked before the config is built.
    Where the architecture's default is a plain number that the config does not compute,
    num_key_value_heads keeps the default's query heads per key/value head (Mistral: 32 / 8 = 4;
    all of them where that does not divide), and head_dim stays hidden_size / num_attention_heads
    where the default is that (Qwen3: 4096 / 32 = 128). Returns (values to set, notes saying so);
    a UserError names the values that do not fit together."""
    def key(name):
        return aliases.get(name, name)

    def number(name, config=None):
        k = key(name)
        v = user[k] if config is None and k in user else getattr(config or base, k, None)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    heads_key, hidden_key = key("num_attention_heads"), key("hidden_size")
    heads, hidden = number("num_attention_heads"), number("hidden_size")
    base_heads, base_hidden = number("num_attention_heads", base), number("hidden_size", base)
    followed, notes = {}, []
    if heads is None:
        return followed, notes
    if heads < 1:
        raise UserError(f"--config: {base.model_type}: {heads_key} must be positive, not {heads}")
    changed = (heads, hidden) != (base_heads, base_hidden)
    head_key = key("head_dim")
    names = set(base.to_dict()) | set(aliases) | set(parameters)
    if head_key in user:
        head_size = "given"
    elif head_key in computed:
        head_size = f"{head_key} is {hidden_key} / {heads_key} unless given"
    elif head_key in parameters and number("head_dim", base) is not None and base_heads and \
            number("head_dim", base) * base_heads == base_hidden:
        head_size = f"{head_key} follows {hidden_key} / {heads_key} (as in {base.model_type}'s default) unless given"
        if changed and hidden is not None and hidden % heads == 0:
            followed[head_key] = hidden // heads
            notes.append(f"{head_key}={hidden // heads} ({hidden_key} {hidden} / {heads_key} {heads})")
    elif any(n in names for n in HEAD_SIZE_SETTINGS):
        head_size = "given"
    else:
        head_size = f"{base.model_type}'s head size is {hidden_key} / {heads_key}"
    if head_size != "given" and hidden is not None and hidden % heads:
        raise UserError(f"--config: {base.model_type}: {hidden_key} {hidden} is not a multiple of {heads_key} {heads} "
                        f"({head_size})")
    for name in KV_HEAD_SETTINGS:
        kv_key, kv, base_kv = key(name), number(name), number(name, base)
        if kv_key not in names or kv_key in computed or kv is None:
            continue
        if kv_key not in user and kv_key in parameters and heads != base_heads and base_kv and base_heads:
            group = base_heads // base_kv if base_heads % base_kv == 0 else 1
            if heads % group == 0:
                kv = heads // group
                notes.append(f"{kv_key}={kv} ({heads_key} {heads} / {group}, the query heads per key/value head of "
                             f"{base.model_type}'s default {base_heads} / {base_kv})")
            else:
                kv = heads
                notes.append(f"{kv_key}={kv} (= {heads_key}: {heads} is no multiple of the {group} query heads per "
                             f"key/value head of {base.model_type}'s default {base_heads} / {base_kv})")
            followed[kv_key] = kv
        check_kv(base.model_type, heads_key, heads, kv_key, kv)
    return followed, notes


def check_kv(model_type, heads_key, heads, kv_key, kv):
    if kv < 1 or heads % kv:
        raise UserError(f"--config: {model_type}: {heads_key} {heads} is not a multiple of {kv_key} {kv} "
                        "(each key/value head serves a whole group of query heads)")


def check_heads(config, aliases):
    """The built config's head counts (also those it computed) must fit together."""
    heads_key = aliases.get("num_attention_heads", "num_attention_heads")
    heads = getattr(config, heads_key, None) if hasattr(config, heads_key) else None
    if not isinstance(heads, int) or isinstance(heads, bool):
        return
    for name in KV_HEAD_SETTINGS:
        kv_key = aliases.get(name, name)
        kv = getattr(config, kv_key, None) if hasattr(config, kv_key) else None
        if isinstance(kv, int) and not isinstance(kv, bool):
            check_kv(config.model_type, heads_key, heads, kv_key, kv)


# The tasks --hf exports: the Auto class and transformers' table of the architectures it maps.
HF_TASKS = {
    "causal-lm": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "masked-lm": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    "seq2seq": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    "speech-seq2seq": ("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
}


def hf_task(config, task):
    """The task and Auto class for the config: --task, else the one whose class the config's
    `architectures` names (a saved model's), else by the model type: masked-LM where
    transformers has one and the config is no decoder, encoder-decoder models as speech or text
    seq2seq, causal LM. Where transformers maps the model type to none of these, a UserError
    names the classes it has and --module."""
    import transformers
    from transformers.models.auto import modeling_auto as auto

    model_type = config.model_type

    def classes_of(table):  # the class names a table maps the model type to
        value = getattr(auto, table, {}).get(model_type)
        return set(value if isinstance(value, (list, tuple)) else [value]) - {None}

    maps = {name for name, (_, table) in HF_TASKS.items() if classes_of(table)}
    if task == "auto":
        named = [name for arch in getattr(config, "architectures", None) or [] for name, (_, table) in HF_TASKS.items()
                 if arch in classes_of(table)]
        if named:
            task = named[0]
        elif "masked-lm" in maps and not getattr(config, "is_decoder", False):
            task = "masked-lm"
        elif getattr(config, "is_encoder_decoder", False) and maps & {"speech-seq2seq", "seq2seq"}:
            task = "speech-seq2seq" if "speech-seq2seq" in maps else "seq2seq"
        elif "causal-lm" in maps:
            task = "causal-lm"
        else:
            task = None
    if task is None or task not in maps:
        tables = [n for n in dir(auto) if n.startswith("MODEL_FOR_") and n.endswith("_MAPPING_NAMES")]
        others = sorted({c for t in tables for c in classes_of(t) if isinstance(c, str)})
        has = f"it has {', '.join(others)}" if others else "it has no model with a head"
        fits = f"; --task {' or '.join(sorted(maps))} fits" if maps else ""
        wanted = f"no {task} model" if task else "none of the models --hf exports (" + ", ".join(HF_TASKS) + ")"
        raise UserError(f"transformers maps {model_type} to {wanted} ({has}{fits}): export it with --module "
                        "module:function returning (model, inputs, loss)")
    return task, getattr(transformers, HF_TASKS[task][0])


def speech_features(model, config, batch, gen):
    """An example batch of the audio features a speech seq2seq model's encoder reads, and the
    input's name: Whisper's log-mel frames [B, num_mel_bins, the frames its encoder requires]."""
    import torch

    name = getattr(model, "main_input_name", "input_features")
    encoder = model.get_encoder() if hasattr(model, "get_encoder") else None
    bins, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
    convs = [getattr(encoder, c, None) for c in ("conv1", "conv2")]
    if name != "input_features" or not bins or not positions or not all(
            isinstance(c, torch.nn.Conv1d) for c in convs):
        raise UserError(f"{type(model).__name__} reads {name} in a layout the exporter does not know (it knows "
                        "Whisper's log-mel features): export it with --module module:function returning "
                        "(model, inputs, loss)")
    frames = positions * convs[0].stride[0] * convs[1].stride[0]
    return name, torch.randn(batch, bins, frames, generator=gen)

def token_ids_in_vocab(config):
    """The config with every special-token id outside its vocabulary set to None (a config made
    smaller than its architecture's default, GPT-2 with vocab_size=4096, keeps bos/eos 50256, which
    from_pretrained warns about): what config.json says must name tokens the model has. Sub-configs
    with a vocabulary of their own are fixed against it (lib/models/hf_config.cpp, the same rule)."""
    for value in config.values():
        if isinstance(value, dict):
            token_ids_in_vocab(value)
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int):
        return config

    def inside(i):
        return not isinstance(i, int) or isinstance(i, bool) or 0 <= i < vocab

    for key, value in config.items():
        if not key.endswith("_token_id"):
            continue
        if isinstance(value, list):
            value = [i for i in value if inside(i)] or None
        elif not inside(value):
            value = None
        config[key] = value
    return config


def hf_source(args):
    """A Hugging Face model, wrapped so that forward(input_ids, labels) returns the loss."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    config = hf_config(args)
    default_experts_implementation(config)
    config.use_cache = False  # training: no key/value cache in the graph
    task, auto_class = hf_task(config, args.task)
    if task == "seq2seq" and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = config.pad_token_id or 0  # T5's convention
    if task in ("seq2seq", "speech-seq2seq"):
        # The decoder reads the start token (and pad where labels are ignored): ids of its vocabulary.
        for key in ("decoder_start_token_id", "pad_token_id"):
            value = getattr(config, key, None)
            if isinstance(value, int) and not 0 <= value < config.vocab_size:
                raise UserError(f"--config: {config.model_type}: {key} {value} is outside vocab_size "
                                f"{config.vocab_size} (the decoder embeds it): give {key}=N below {config.vocab_size}")
    torch.manual_seed(args.seed)
    try:
        if args.pretrained:
            model = auto_class.from_pretrained(args.pretrained, config=config, local_files_only=True)
        else:
            model = auto_class.from_config(config)
    except (ValueError, TypeError, AssertionError, ImportError, RuntimeError, KeyError) as e:
        # The model's own checks of its config (shapes, implementations it cannot use).
        raise UserError(f"{config.model_type} cannot be built from this config: {first_line(e)}") from e
    model.train()
    vocab = config.vocab_size
    seq = args.seq_len
    limit = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None) or \
        getattr(config, "max_target_positions", None)
    if limit and seq > limit:
        raise UserError(f"--seq-len {seq} exceeds the model's {limit} positions")

    class CausalOrMasked(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, labels):
            with autocast(args.precision):
                return self.model(input_ids=input_ids, labels=labels).loss

    class SpeechToText(torch.nn.Module):
        """Audio features in, the decoder's loss on the labels (the model shifts them right)."""

        def __init__(self, model, features):
            super().__init__()
            self.model = model
            self.features = features

        def forward(self, features, labels):
            with autocast(args.precision):
                return self.model(**{self.features: features}, labels=labels).loss

    if args.output_chunks > 1:
        chunk_output_projection(model, args.output_chunks)
    gen = torch.Generator().manual_seed(args.seed)
    if task == "speech-seq2seq":
        if args.loss_chunk_tokens:
            raise UserError("--loss-chunk-tokens: speech models are exported with their own loss; leave it out")
        feature_name, features = speech_features(model, config, args.batch_size, gen)
        ids = torch.randint(0, vocab, (args.batch_size, seq), generator=gen)
        wrapper = SpeechToText(model, feature_name)
        if not args.keep_activations:
            fuse_tanh_gelu(model, lambda: float(wrapper(features, ids)), args.precision)
        # Features: synthetic (normal) unless a sample file gives them (--data F.safetensors).
        roles = {feature_name: {"role": "randn"}, "labels": {"role": "tokens", "vocab": vocab}}
        return wrapper, "model.", {feature_name: features, "labels": ids}, roles, hf_description(config, task, model)
    wrapper = CausalOrMasked(model)
    ids = torch.randint(0, vocab, (args.batch_size, seq), generator=gen)
    if not args.keep_activations:
        fuse_tanh_gelu(model, lambda: float(wrapper(ids, ids)), args.precision)
    if task == "masked-lm":
        mask_token = getattr(config, "mask_token_id", None) or 0
        roles = {"input_ids": {"role": "mlm_tokens", "mask_token": mask_token}, "labels": {"role": "mlm_labels"}}
        labels = ids.clone()
        labels[torch.rand(ids.shape, generator=gen) > 0.15] = -100
    else:
        # Causal LMs shift labels inside (labels = input ids); seq2seq learns to copy its input.
        roles = {"input_ids": {"role": "tokens"}, "labels": {"role": "tokens"}}
        labels = ids.clone()
    if args.loss_chunk_tokens:
        # A model that changes its logits after the head (soft-capping, scaling) or its loss
        # would export silently wrong: compare the two losses without dropout, also with the
        # head's weight scaled up 32x (a power of two: restored exactly), since soft-capping
        # barely shows on the small logits of fresh weights.
        head_weight = model.get_output_embeddings().weight

        def losses(loss_of):
            out = []
            with torch.no_grad():
                for scale in (1.0, 32.0):
                    head_weight.mul_(scale)
                    out.append(float(loss_of(ids, labels)))
                    head_weight.div_(scale)
            return out

        model.eval()
        expected = losses(wrapper)
        wrapper = fused_lm_loss(model, task, args.loss_chunk_tokens, args.precision)
        got = losses(wrapper)
        model.train()
        tolerance = 1e-2 if args.precision == "bf16" else 1e-4
        for g, e in zip(got, expected):
            if not abs(g - e) <= tolerance * abs(e) + 1e-6:
                raise UserError(f"--loss-chunk-tokens: the fused loss of {type(model).__name__} is {g:.6g}, its own "
                                f"loss {e:.6g}: it does more after its output projection than a linear; export it "
                                "without --loss-chunk-tokens")

    for r in roles.values():
        r["vocab"] = vocab
    description = hf_description(config, task, model)
    if args.loss_chunk_tokens:
        description["loss_chunk_tokens"] = args.loss_chunk_tokens
    return wrapper, "model.", {"input_ids": ids, "labels": labels}, roles, description


def hf_description(config, task, model):
    description = {
        "source": "hf",
        "architecture": config.model_type,
        "task": task,
        "model_class": type(model).__name__,
        "hf_config": token_ids_in_vocab(config.to_dict()),
    }
    if experts_modules(model):
        description["experts_implementation"] = config._experts_implementation
    return description


# ----------------------------------------------------------------------------- mixtures of experts

DENSE_EXPERTS = "dense"


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The experts_implementation the exporter chooses: plain ATen operations whose shapes
    follow the batch alone. Every expert computes every token and each token sums the experts'
    outputs by its routing weights, zero for the experts it was not routed to: the routed
    experts' sum. (transformers' default, grouped_mm, traces in float32 to its own operator
    transformers::grouped_mm_fallback, which LibTorch cannot run, and aten::_grouped_mm traces only
    in bf16; "eager" loops over routed tokens in sizes torch.export cannot capture; batched_mm
    gathers a copy of the weights for each routed token.) The up projection is one linear over
    all experts' rows, and the routing weights scale the gated activations before the down
    projection (linear: the same sum), so backward keeps about 5 x intermediate floats per token
    and expert: experts / top_k times what the routed tokens alone would need, where batched_mm
    keeps 3 x intermediate x hidden per token and routed expert. Mixtral (2 layers, hidden 256,
    intermediate 512, 8 experts, top 2), 256 tokens, bytes autograd keeps besides the weights:
    dense 46 MiB, grouped_mm (eager only) 16 MiB, batched_mm 1552 MiB."""
    import torch

    if getattr(self, "_is_expert_parallel", False):
        raise UserError("expert parallel experts cannot be exported")
    tokens, hidden = hidden_states.shape
    experts = self.num_experts
    routing = torch.zeros(tokens, experts, dtype=top_k_weights.dtype, device=top_k_weights.device)
    routing = routing.scatter(1, top_k_index, top_k_weights)  # [tokens, experts]
    up_weight = self.gate_up_proj if self.has_gate else self.up_proj
    up_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias) if self.has_bias else None
    if self.is_transposed:  # [experts, hidden, out]
        up = torch.matmul(hidden_states, up_weight.permute(1, 0, 2).reshape(hidden, -1))
    else:  # [experts, out, hidden]: one linear over the experts' rows
        up = torch.nn.functional.linear(hidden_states, up_weight.reshape(-1, hidden))
    up = up.reshape(tokens, experts, -1)
    if up_bias is not None:
        up = up + up_bias
    act = self._apply_gate(up) if self.has_gate else self.act_fn(up)  # [tokens, experts, intermediate]
    down_weight = self.down_proj if self.is_transposed else self.down_proj.transpose(1, 2)  # [experts, inter, hidden]
    if self.has_post_expert_norm:  # a norm of each expert's output: the routing weights after it
        out = torch.bmm(act.transpose(0, 1), down_weight)  # [experts, tokens, hidden]
        if self.has_bias:
            out = out + self.down_proj_bias.unsqueeze(1)
        out = self.post_expert_norm(out) * routing.t().unsqueeze(-1)
        return out.sum(0).to(hidden_states.dtype)
    act = act * routing.unsqueeze(-1).to(act.dtype)
    out = torch.bmm(act.transpose(0, 1), down_weight).sum(0)  # [tokens, hidden]
    if self.has_bias:
        out = out + torch.matmul(routing.to(self.down_proj_bias.dtype), self.down_proj_bias)
    return out.to(hidden_states.dtype)


def default_experts_implementation(config):
    """Mixture-of-experts layers in plain ATen operations (dense_experts_forward) unless the
    user chose an implementation (--config experts_implementation=...). The name chosen, or None
    where this transformers has no experts implementations."""
    try:
        from transformers.integrations import moe
    except ImportError:
        return None
    if DENSE_EXPERTS not in moe.ALL_EXPERTS_FUNCTIONS:
        moe.ExpertsInterface.register(DENSE_EXPERTS, dense_experts_forward)
    if getattr(config, "_experts_implementation", None) is None:
        config._experts_implementation = DENSE_EXPERTS
    return config._experts_implementation


def experts_modules(model):
    """The modules whose forward transformers' experts implementation setting picks."""
    return [name for name, m in model.named_modules() if hasattr(m, "_is_expert_parallel") and hasattr(m, "has_gate")]


def fuse_tanh_gelu(model, loss, precision):
    """Hugging Face's gelu_new and gelu_fast activations are the tanh approximation of GELU
    written out in eight elementwise operators, each one a pass over the MLP's widest tensor and
    several of them kept for the backward. They become one `gelu(approximate="tanh")` node, which
    computes the same function and keeps only its input. `loss()` (no dropout) must not move by
    more than rounding."""
    import torch
    import transformers.activations as acts

    composite = tuple(getattr(acts, name) for name in ("NewGELUActivation", "FastGELUActivation") if hasattr(acts, name))
    found = [m for m in model.modules() if isinstance(m, composite)]
    if not found:
        return
    model.eval()
    with torch.no_grad():
        try:
            before = loss()
        except Exception as e:  # noqa: BLE001 - the model's own checks of its inputs and shapes
            raise UserError(f"{type(model).__name__} fails on the example batch: {first_line(e)}") from e
        for m in found:
            replace_module(model, m, torch.nn.GELU(approximate="tanh"))
        after = loss()
    model.train()
    tolerance = 1e-2 if precision == "bf16" else 1e-5
    if not abs(after - before) <= tolerance * abs(before) + 1e-6:
        raise RuntimeError(f"the fused GELU changed the loss from {before:.8g} to {after:.8g}")


def replace_module(model, old, new):
    """Puts `new` where the submodule `old` is in `model`."""
    path = next(name for name, m in model.named_modules() if m is old)
    parent_path, _, attribute = path.rpartition(".")
    setattr(model.get_submodule(parent_path) if parent_path else model, attribute, new)


def chunk_output_projection(model, chunks):
    """The model's output projection computed as `chunks` projections over ranges of its rows
    (the vocabulary), concatenated: the same logits, but nodes a plan can cut between, where the
    whole projection is one node that may outweigh a stage (docs/planner.md, "A node too large for
    its stage"). Its weight and bias stay the same objects under the same names."""
    import torch

    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise UserError(f"--output-chunks: {type(model).__name__}'s output projection is a "
                        f"{type(head).__name__}, not a Linear")
    rows = head.weight.shape[0]
    if not 1 < chunks <= rows:
        raise UserError(f"--output-chunks {chunks}: the output projection has {rows} rows")
    step = -(-rows // chunks)

    class ChunkedProjection(torch.nn.Module):
        def __init__(self, linear):
            super().__init__()
            self.weight = linear.weight
            self.bias = linear.bias

        def forward(self, x):
            # One split of the weight: its backward assembles the weight's gradient once from the
            # chunks' (a slice per chunk would allocate a whole gradient for each).
            weights = torch.split(self.weight, step)
            biases = torch.split(self.bias, step) if self.bias is not None else [None] * len(weights)
            return torch.cat([torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases)], dim=-1)

    replace_module(model, head, ChunkedProjection(head))


def fused_lm_loss(model, task, chunk_tokens, precision):
    """The model with its output projection replaced by a pass-through that keeps the same
    parameters under the same names, and the loss computed from the hidden states by
    dawnpiper::linear_cross_entropy (scripts/dawnpiper_ops.py): the logits are never held whole.
    The loss is the model's own: causal LMs predict the next token (labels shifted inside, as
    Hugging Face does), masked LMs the labelled positions, seq2seq models the labels from the
    decoder's input (the labels shifted right)."""
    import torch

    import dawnpiper_ops  # noqa: F401 - registers the operator

    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise UserError(f"--loss-chunk-tokens: {type(model).__name__}'s output projection is a "
                        f"{type(head).__name__}, not a Linear")
    if task == "seq2seq" and not hasattr(model, "prepare_decoder_input_ids_from_labels"):
        raise UserError(f"--loss-chunk-tokens: {type(model).__name__} does not say how its decoder input is made")

    class PassThrough(torch.nn.Module):
        """Where the head was: its weight and bias (same objects, same names), no computation."""

        def __init__(self, linear):
            super().__init__()
            self.weight = linear.weight
            self.bias = linear.bias

        def forward(self, x):
            return x

    projection = PassThrough(head)
    replace_module(model, head, projection)

    class FusedLoss(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, labels):
            with autocast(precision):
                if task == "seq2seq":
                    decoder_input_ids = self.model.prepare_decoder_input_ids_from_labels(labels=labels)
                    hidden = self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits
                else:
                    hidden = self.model(input_ids=input_ids).logits
                if task == "causal-lm":  # the next token; the last position has none (as HF pads it)
                    labels = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
                return torch.ops.dawnpiper.linear_cross_entropy(hidden, projection.weight, projection.bias, labels,
                                                                chunk_tokens)

    return FusedLoss(model)


def module_source(args):
    """A user's function: module:function returning (model, inputs, loss[, roles])."""
    import torch

    spec = args.module
    if ":" not in spec:
        raise UserError(f"--module {spec}: expected module:function")
    module_name, function_name = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    for path in args.path or []:
        sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"--module {spec}: cannot import {module_name} ({e})")
    function = getattr(module, function_name, None)
    if function is None:
        raise UserError(f"--module {spec}: {module_name} has no {function_name}")
    torch.manual_seed(args.seed)
    result = function(**parse_overrides(args.config))
    if isinstance(result, dict):
        model, inputs, loss, roles = result.get("model"), result.get("inputs"), result.get("loss"), result.get("roles")
    elif isinstance(result, (tuple, list)) and len(result) in (3, 4):
        model, inputs, loss = result[:3]
        roles = result[3] if len(result) == 4 else None
    else:
        raise UserError(f"{spec} must return (model, inputs, loss) or (model, inputs, loss, roles)")
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"{spec}: the model is a {type(model).__name__}, not a torch.nn.Module")
    if not isinstance(inputs, dict) or not all(isinstance(v, torch.Tensor) for v in inputs.values()):
        raise UserError(f"{spec}: inputs must be a dict of name -> tensor (batch first)")
    if not callable(loss):
        raise UserError(f"{spec}: loss must be a callable loss(model_output, inputs) -> scalar tensor")
    roles = dict(roles or {})
    for name, x in inputs.items():
        if name not in roles:
            if x.is_floating_point():
                roles[name] = {"role": "randn"}
            else:
                roles[name] = {"role": "randint", "high": int(x.max().item()) + 1}
        elif isinstance(roles[name], str):
            roles[name] = {"role": roles[name]}
    names = list(inputs)

    # The batch goes to the model by keyword when its forward names every input, else in order.
    try:
        accepted = set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        accepted = set()
    by_keyword = all(n in accepted for n in names)

    class WithLoss(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            batch = dict(zip(names, tensors))
            with autocast(args.precision):
                out = self.model(**batch) if by_keyword else self.model(*tensors)
                return loss(out, batch)

    model.train()
    return WithLoss(model), "model.", inputs, roles, {"source": "module", "function": spec}


# ----------------------------------------------------------------------------- capture


def module_names(root):
    return {id(m): name for name, m in root.named_modules()}


def capture_error(e, wrapper, prefix):
    """The module torch.export failed in (deepest frame with an nn.Module self) and the reason."""
    import torch

    names = module_names(wrapper)
    where = None
    module = None
    tb = e.__traceback__
    while tb is not None:
        self_obj = tb.tb_frame.f_locals.get("self")
        if isinstance(self_obj, torch.nn.Module) and id(self_obj) in names:
            where = names[id(self_obj)]
            module = self_obj
        tb = tb.tb_next
    text = str(e)
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    reason = lines[0] if lines else type(e).__name__
    for marker in ("Caused by:", "User code", "Could not guard on data-dependent", "Data-dependent"):
        hit = [l for l in lines if marker in l]
        if hit and "data-dependent" in text.lower():
            reason = "data-dependent control flow (" + lines[0][:200] + ")"
            break
    if where is not None and where.startswith(prefix):
        where = where[len(prefix):]
    location = f"module '{where}'" if where else f"the model ({type(wrapper).__name__})"
    for l in lines:  # torch.export names the user's source line: keep it
        if l.startswith("File ") or " line " in l and ".py" in l:
            reason += f"; at {l}"
            break
    remedy = ""
    config = getattr(module, "config", None)
    chosen = getattr(config, "_experts_implementation", None)
    if hasattr(module, "_is_expert_parallel") and chosen != DENSE_EXPERTS:
        remedy = (f" (its experts_implementation {chosen!r} cannot be captured: export with --config "
                  f"experts_implementation={DENSE_EXPERTS}, the exporter's default)")
    return f"torch.export cannot capture {location}: {reason[:600]}{remedy}"


def module_paths(program):
    """Module path by node name, also inside higher-order regions (autocast, no_grad), whose
    nodes lose their module stack when decompositions inline them."""
    import torch

    paths = {}

    def visit(module):
        for node in module.graph.nodes:
            stack = node.meta.get("nn_module_stack")
            if stack:
                paths[node.name] = list(stack.values())[-1][0]
        for _, child in module.named_children():
            if isinstance(child, torch.fx.GraphModule):
                visit(child)

    children = [c for _, c in program.graph_module.named_children() if isinstance(c, torch.fx.GraphModule)]
    if not children:
        return {}  # no such regions: every node kept its own stack
    visit(program.graph_module)
    return paths


def relax_views(program):
    """Functionalization turns reshape into view or clone+view by the tracer's strides, which need
    not be the strides the real kernels produce (CPU attention returns a transposed layout): a
    view the tracer allowed can fail at run time. reshape views wherever view would and copies
    where it must, so every view becomes a reshape."""
    import torch

    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    program.graph_module.recompile()


def export_program(wrapper, inputs, prefix, max_batch):
    import torch
    from torch.export import Dim

    quiet_torch_logs()
    batch = Dim("B", min=1, max=max_batch)
    names = list(inputs)
    args = tuple(inputs[n] for n in names)
    for n, x in inputs.items():
        if x.dim() == 0:
            raise UserError(f"input '{n}' has no batch dimension")
    # Dynamic shapes by position; a forward(*tensors) takes them as one tuple.
    dynamic = tuple({0: batch} for _ in names)
    params = inspect.signature(wrapper.forward).parameters.values()
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        dynamic = (dynamic,)
    # torch.export logs graphs and guesses while it works; the outcome is what users need, so
    # its stderr goes to a file kept only for --verbose.
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            program = torch.export.export(wrapper, args, dynamic_shapes=dynamic, strict=False)
            paths = module_paths(program)
            program = program.run_decompositions({})
            relax_views(program)
        except Exception as e:  # noqa: BLE001 - torch.export raises many kinds; all are the model's
            error = e
        else:
            error = None
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if VERBOSE:
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace"))
    if error is not None:
        raise UserError(capture_error(error, wrapper, prefix)) from error
    return program, names, paths


# Operators outside ATen that DawnPiper runs as its own nodes (lib/models/model_file.cpp).
DAWNPIPER_OPERATORS = {"dawnpiper::linear_cross_entropy"}


def foreign_operator_remedy(op, source):
    """What to change so that the export computes `op` in ATen operations."""
    if op.startswith("transformers::grouped_mm"):
        return (f"export with --config experts_implementation={DENSE_EXPERTS} (the exporter's default: every expert "
                "on every token, in ATen operations) or batched_mm")
    if op.startswith("transformers::") or source == "hf":
        return ("export with the model's attn_implementation / experts_implementation set to one in ATen operations "
                f"(--config attn_implementation=sdpa or eager, experts_implementation={DENSE_EXPERTS})")
    return "compute it with ATen operations (torch functions) in the model instead of the custom operator"


def check_operators(program, paths, prefix, source):
    """Every node must call an operator this LibTorch runs: ATen's, or DawnPiper's own. Another
    (a library's custom operator, torch.library.custom_op) would export and then fail in every
    DawnPiper command: a UserError naming the node, the operator and what to change."""
    for node in program.graph.nodes:
        if node.op != "call_function" or not hasattr(node.target, "_schema"):
            continue  # Python functions: size arithmetic, getitem (build_graph checks the rest)
        op = node.target._schema.name
        if op.split("::")[0] == "aten" or op in DAWNPIPER_OPERATORS:
            continue
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else paths.get(node.name, "")
        path = path[len(prefix):] if path.startswith(prefix) else ("" if path + "." == prefix else path)
        where = f"{path}/{node.name}" if path else node.name
        raise UserError(f"node {where} calls {op}, an operator LibTorch does not have (not ATen): "
                        f"{foreign_operator_remedy(op, source)}")


# ----------------------------------------------------------------------------- graph


DTYPE_NAMES = {
    "torch.float32": "float32", "torch.float64": "float64", "torch.float16": "float16",
    "torch.bfloat16": "bfloat16", "torch.int64": "int64", "torch.int32": "int32", "torch.int16": "int16",
    "torch.int8": "int8", "torch.uint8": "uint8", "torch.bool": "bool",
}
SKIPPED_OPS = {"aten::_assert_tensor_metadata", "aten::_assert_scalar", "aten::sym_constrain_range_for_size",
               "aten::sym_constrain_range", "aten::_assert_async"}


def dtype_name(dtype):
    name = DTYPE_NAMES.get(str(dtype))
    if name is None:
        raise UserError(f"tensors of dtype {dtype} are not supported")
    return name


class BatchExpr:
    """Symbolic sizes are affine in the batch size B: encoded as [a, b] = a*B + b."""

    def __init__(self, symbol):
        self.symbol = symbol

    def encode(self, value):
        import sympy
        import torch

        if isinstance(value, torch.SymInt):
            expr = value.node.expr
        elif isinstance(value, int):
            return value
        else:
            expr = value
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        symbols = expr.free_symbols
        if len(symbols) != 1:
            raise UserError(f"a size depends on {sorted(map(str, symbols))}; only the batch dimension may vary")
        (s,) = symbols
        if self.symbol is None:
            self.symbol = s
        if s != self.symbol:
            raise UserError(f"a size depends on {s}, not on the batch dimension")
        poly = sympy.Poly(expr, s)
        if poly.degree() > 1 or not all(c.is_Integer for c in poly.all_coeffs()):
            raise UserError(f"size {expr} is not an affine function of the batch size")
        coeffs = [int(c) for c in poly.all_coeffs()]
        a, b = (coeffs + [0])[:2] if len(coeffs) == 2 else (0, coeffs[0])
        return {"sym": [a, b]}


def tensor_meta(x, batch, requires_grad=False):
    return {
        "shape": [batch.encode(d) for d in x.shape],
        "strides": [batch.encode(s) for s in x.stride()],
        "dtype": dtype_name(x.dtype),
        "requires_grad": bool(requires_grad),
    }


def layer_of(path):
    """The module path of the model's own layer: the shortest prefix ending in a list index
    ('transformer.h.3', 'model.layers.0'), '' when the node belongs to no numbered layer."""
    parts = path.split(".") if path else []
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return ""


def tied_names(wrapper, prefix):
    """Every name a parameter goes by (tied weights have several), first in module order first."""
    groups = {}
    for name, p in wrapper.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name[len(prefix):] if name.startswith(prefix) else name)
    return {n: g for g in groups.values() for n in g}


def observe(program, inputs):
    """Runs the exported graph once on the example inputs: which node outputs autograd tracks,
    and which share the storage of a tensor argument (the real kernels decide: reshape views or
    copies, _unsafe_view views without saying so in its schema). Per node, per output:
    (requires_grad, argument position it aliases or -1)."""
    import torch

    sig = program.graph_signature
    state = dict(program.state_dict)
    state.update(program.constants)
    flat, user = [], iter(inputs.values())
    for spec in sig.input_specs:
        flat.append(next(user) if spec.kind.name == "USER_INPUT" else state[spec.target])
    found = {}

    def storage(x):
        return x.untyped_storage().data_ptr() if isinstance(x, torch.Tensor) and x.numel() > 0 else None

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            items = result if isinstance(result, (list, tuple)) else [result]
            args = [self.env[a] if isinstance(a, torch.fx.Node) else None for a in n.args] if n.op == "call_function" else []
            arg_storages = [storage(a) for a in args]
            entries = []
            for x in items:
                s = storage(x)
                alias = arg_storages.index(s) if s is not None and s in arg_storages else -1
                entries.append((bool(getattr(x, "requires_grad", False)), alias))
            found[n.name] = entries
            return result

    with torch.enable_grad():
        Recorder(program.graph_module).run(*flat)
    return found


def build_graph(program, input_names, prefix, roles, names_of, observed, paths):
    import operator

    import torch

    sig = program.graph_signature
    batch = BatchExpr(None)
    weights = {}  # placeholder name -> (kind, weight name: a tied parameter's first name)
    user_inputs = []
    kinds = {"PARAMETER": "param", "BUFFER": "buffer", "CONSTANT_TENSOR": "constant"}
    for spec in sig.input_specs:
        kind = spec.kind.name
        if kind in kinds:
            target = spec.target[len(prefix):] if spec.target.startswith(prefix) else spec.target
            if kind == "PARAMETER":
                target = names_of.get(target, [target])[0]
            weights[spec.arg.name] = (kinds[kind], target)
        elif kind == "USER_INPUT":
            user_inputs.append(spec.arg.name)
        else:
            raise UserError(f"torch.export input kind {kind} is not supported")
    if len(user_inputs) != len(input_names):
        raise UserError("the exported program's inputs do not match the example inputs")
    input_alias = dict(zip(user_inputs, input_names))

    values = {}  # fx node name -> tensor name(s) in the model file
    meta = {}
    inputs, nodes = [], []
    for node in program.graph.nodes:
        if node.op == "placeholder":
            if node.name in weights:
                continue
            name = input_alias[node.name]
            x = node.meta["val"]
            entry = {"name": name, **tensor_meta(x, batch)}
            entry.update(roles.get(name, {}))
            inputs.append(entry)
            values[node.name] = name
            continue
        if node.op == "output":
            continue
        if node.op != "call_function":
            raise UserError(f"graph node {node.name} ({node.op}) is not an ATen call")
        if node.target is operator.getitem:
            source, index = node.args
            values[node.name] = (source.name, index)
            continue
        val = node.meta.get("val")
        if not hasattr(node.target, "_schema"):
            if isinstance(val, (torch.SymInt, int, float, bool)):
                continue  # size arithmetic: folded into the sizes that use it
            raise UserError(f"graph node {node.name} calls {node.target}, not an ATen operator")
        schema = node.target._schema
        if schema.name in SKIPPED_OPS or schema.name == "aten::sym_size":
            continue
        if isinstance(val, (torch.SymInt, int, float, bool)) or val is None:
            continue  # scalar results are folded (their users get sizes) or unused
        meta[node.name] = (node, schema, val)
        nodes.append(node)

    # Which outputs of multi-output nodes are read (getitem users), and their names.
    output_names = {}
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is operator.getitem:
            source, index = node.args
            output_names[(source.name, index)] = node.name

    def encode(value, node, arg_type):
        if isinstance(value, torch.fx.Node):
            if value.name in weights:
                return {"w": weights[value.name][1]}
            v = value.meta.get("val")
            if isinstance(v, torch.SymInt) or isinstance(v, (int, bool)) and not isinstance(v, torch.Tensor):
                return batch.encode(v)
            ref = values.get(value.name)
            if ref is None:
                raise UserError(f"{node.name} reads {value.name}, which the graph does not produce")
            if isinstance(ref, tuple):
                return {"t": output_names[ref]}
            return {"t": ref}
        if isinstance(value, (list, tuple)):
            return [encode(v, node, arg_type) for v in value]
        if isinstance(value, torch.SymInt):
            return batch.encode(value)
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return value
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if isinstance(value, torch.dtype):
            return {"dtype": dtype_name(value)}
        if isinstance(value, torch.device):
            return {"device": str(value.type)}
        if isinstance(value, torch.layout):
            return {"layout": str(value).replace("torch.", "")}
        if isinstance(value, torch.memory_format):
            return {"memory_format": str(value).replace("torch.", "")}
        raise UserError(f"{node.name}: argument {value!r} of type {type(value).__name__} is not supported")

    out_nodes = []
    for node in nodes:
        _, schema, val = meta[node.name]
        args = []
        kwargs = dict(node.kwargs)
        for i, a in enumerate(schema.arguments):
            if i < len(node.args):
                v = node.args[i]
            elif a.name in kwargs:
                v = kwargs.pop(a.name)
            elif a.has_default_value():
                v = a.default_value
            else:
                raise UserError(f"{node.name} ({schema.name}) lacks argument {a.name}")
            args.append(encode(v, node, a.type))
        if kwargs:
            raise UserError(f"{node.name} ({schema.name}) has unknown arguments {sorted(kwargs)}")
        # Outputs: one per returned tensor (tensor lists flattened), with the input they view.
        results = list(val) if isinstance(val, (list, tuple)) else [val]
        aliases = []
        for r in schema.returns:
            sets = r.alias_info.before_set if r.alias_info is not None else set()
            source = -1
            if sets:
                for j, a in enumerate(schema.arguments):
                    if a.alias_info is not None and a.alias_info.before_set & sets and not a.alias_info.is_write:
                        source = j
                        break
            aliases.append(source)
        outputs = []
        single = not isinstance(val, (list, tuple))
        for k, x in enumerate(results):
            if x is None:
                outputs.append(None)
                continue
            if not isinstance(x, torch.Tensor):
                raise UserError(f"{node.name} ({schema.name}) returns a {type(x).__name__}")
            name = node.name if single else output_names.get((node.name, k), f"{node.name}.{k}")
            # May it share an argument's storage? The schema says for views; the real run for
            # ops that view depending on strides (reshape) or without saying (_unsafe_view).
            seen = observed.get(node.name, [])
            rg, alias = seen[k] if k < len(seen) else (False, -1)
            view_arg = alias if alias >= 0 else (aliases[min(k, len(aliases) - 1)] if aliases else -1)
            outputs.append({"name": name, **tensor_meta(x, batch, rg), "view_of_arg": view_arg})
        if single:
            values[node.name] = node.name
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else ""
        if path + "." == prefix or not path:  # inlined from a higher-order region: recover it by name
            path = paths.get(node.name, path)
        path = path[len(prefix):] if path.startswith(prefix) else ("" if path + "." == prefix else path)
        out_nodes.append({
            "name": node.name,
            "op": schema.name,
            "overload": schema.overload_name,
            "args": args,
            "outputs": outputs,
            "module": path,
            "layer": layer_of(path),
        })
    out = [n for n in program.graph.nodes if n.op == "output"][0]
    loss = out.args[0][0] if isinstance(out.args[0], (list, tuple)) else out.args[0]
    if len(out.args[0]) != 1 if isinstance(out.args[0], (list, tuple)) else False:
        raise UserError("the model must return exactly one value: the loss")
    lv = loss.meta.get("val")
    if not isinstance(lv, torch.Tensor) or lv.dim() != 0 or not lv.is_floating_point():
        raise UserError("the loss must be a floating-point scalar tensor")
    if loss.name not in meta or out_nodes[-1]["name"] != loss.name:
        raise UserError("the loss is not the last operation of the graph")
    return inputs, live_nodes(out_nodes, loss.name), weights, batch


def live_nodes(nodes, loss):
    """The nodes the loss depends on. torch.export keeps a computation that only an assertion
    reads (aten::_assert_tensor_metadata has effects, so its dead-code pass keeps it and what it
    checks); the assertions are left out of the file (SKIPPED_OPS), and what they alone read
    would be a node whose outputs nobody reads, which DawnPiper refuses. Qwen2-MoE builds a
    sliding-window attention mask that no layer uses and that only such assertions read."""
    live, kept = {loss}, []

    def reads(a):
        if isinstance(a, dict) and "t" in a:
            live.add(a["t"])
        elif isinstance(a, list):
            for x in a:
                reads(x)

    for n in reversed(nodes):
        if any(o is not None and o["name"] in live for o in n["outputs"]):
            kept.append(n)
            reads(n["args"])
    if VERBOSE and len(kept) < len(nodes):
        print(f"export_model.py: left out {len(nodes) - len(kept)} nodes the loss does not depend on")
    return kept[::-1]


def weight_table(program, weights, nodes, prefix, names_of):
    """Parameters (with the other names tied copies go by), buffers and constants the graph reads."""
    state = dict(program.state_dict)
    state.update(program.constants)
    read = set()

    def walk(a):
        if isinstance(a, dict) and "w" in a:
            read.add(a["w"])
        elif isinstance(a, list):
            for x in a:
                walk(x)

    for n in nodes:
        walk(n["args"])
    table, tensors = [], {}
    for placeholder, (kind, name) in weights.items():
        if name not in read or name in tensors:
            continue
        full = prefix + name
        t = state.get(full, state.get(name))
        if t is None:
            raise UserError(f"no value for {kind} {name}")
        t = t.detach()
        entry = {"name": name, "kind": kind, "shape": list(t.shape), "dtype": dtype_name(t.dtype)}
        if kind == "param":
            entry["aliases"] = [a for a in names_of.get(name, []) if a != name]
        table.append(entry)
        tensors[name] = t.contiguous().clone()
    return table, tensors


def blocks_of(nodes):
    """Contiguous blocks: 'embed' before the first numbered layer, one per layer, 'head' after."""
    blocks, current = [], None
    seen = set()
    for n in nodes:
        layer = n["layer"]
        if current is None:
            current = layer or "embed"
            blocks.append(current)
            seen.add(current)
        elif layer and layer != current and layer not in seen:
            current = layer
            blocks.append(current)
            seen.add(current)
        n["block"] = len(blocks) - 1
    # Nodes after the last layer form the head.
    last_layer = max((i for i, n in enumerate(nodes) if n["layer"]), default=-1)
    if 0 <= last_layer < len(nodes) - 1:
        blocks.append("head")
        for n in nodes[last_layer + 1:]:
            n["block"] = len(blocks) - 1
    for n in nodes:
        del n["layer"]
    return blocks


# ----------------------------------------------------------------------------- output


def dawnpiper_binary(given):
    """The dawnpiper that checks the written file: --dawnpiper, $DAWNPIPER_BIN, this checkout's
    build/dawnpiper, or one on PATH; None where there is none."""
    import shutil

    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise UserError(f"--dawnpiper {given}: no such executable")
        return given
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.environ.get("DAWNPIPER_BIN"), os.path.join(here, "..", "build", "dawnpiper"),
                      shutil.which("dawnpiper")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def check_with_trainer(path, binary, shown):
    """Loads the written file with the trainer's own checks (`dawnpiper graph --model-file F
    --summary`: every subcommand reads a model file the same way): a graph the trainer would
    refuse is refused here, at export, with the trainer's reason (which names the node)."""
    import subprocess

    # Run alone: not as a rank of a job this export may run inside.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_", "SLURM_STEP"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["DAWNPIPER_CACHE"] = "off"
    try:
        run = subprocess.run([binary, "graph", "--model-file", path, "--summary"], capture_output=True, text=True,
                             env=env, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"cannot check the model file with {binary}: {first_line(e)} (--no-check skips the check)")
    if run.returncode == 0:
        return
    lines = [l.strip() for l in run.stderr.splitlines() if l.strip()]
    reason = lines[-1] if lines else f"exit status {run.returncode}"
    for prefix in ("dawnpiper: error: ", "dawnpiper: ", "configuration error: "):
        reason = reason[len(prefix):] if reason.startswith(prefix) else reason
    reason = reason.replace(path, shown)  # the file it checked is the temporary one
    raise UserError(f"dawnpiper would refuse this export ({reason}); nothing was written: export the model with "
                    "--module, computing that part with other torch operations, or report the model")


def write_model_file(path, graph, tensors, binary=None):
    """Writes the file whole or not at all; with `binary`, only a file that dawnpiper loads."""
    from safetensors.torch import save_file

    metadata = {"format": "pt", "dawnpiper_model": json.dumps(graph, separators=(",", ":"))}

    def write(tmp):
        save_file(tensors, tmp, metadata=metadata)
        if binary:
            check_with_trainer(tmp, binary, path)

    atomic_write(path, write, ".export-")


def write_reference(path, wrapper, inputs, prefix, seed):
    """Eager loss and every parameter's gradient on the example batch (for equivalence tests)."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    wrapper.zero_grad(set_to_none=True)
    loss = wrapper(*inputs.values())
    loss.backward()
    out = {"loss": loss.detach().reshape(1).clone()}
    for name, x in inputs.items():
        out["input." + name] = x.contiguous().clone()
    for name, p in wrapper.named_parameters():
        key = name[len(prefix):] if name.startswith(prefix) else name
        if p.grad is not None:
            out["grad." + key] = p.grad.detach().contiguous().clone()
    atomic_write(path, lambda tmp: save_file(out, tmp), ".export-")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", help="Hugging Face transformers architecture (model_type), e.g. gpt2, bert, t5, llama")
    src.add_argument("--hf-config", help="a Hugging Face config.json (or its directory)")
    src.add_argument("--pretrained", help="a local save_pretrained() directory: its config and weights")
    src.add_argument("--module", help="module:function returning (model, inputs, loss[, roles])")
    parser.add_argument("--config", default="", help="key=value,... overrides of the HF config, or the function's keyword arguments")
    parser.add_argument("--task", default="auto", choices=["auto", *HF_TASKS],
                        help="HF sources: which head (default: the config's architecture, else by its model type)")
    parser.add_argument("--path", action="append", help="directory to import --module from (repeatable)")
    parser.add_argument("--seq-len", type=int, default=128, help="sequence length (HF sources)")
    parser.add_argument("--batch-size", type=int, default=2, help="example batch size traced (HF sources)")
    parser.add_argument("--max-batch", type=int, default=65536, help="largest micro-batch size the file allows")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the example batch")
    parser.add_argument("--reference", help="also write the eager loss and gradients on the example batch here")
    parser.add_argument("--out", required=True, help="model file to write (safetensors with the graph in its metadata)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                        help="bf16: mixed precision as torch.autocast does it (bf16 compute, fp32 master weights)")
    parser.add_argument("--loss-chunk-tokens", type=int, default=0,
                        help="HF sources: fuse the LM head with its loss, computing the logits of this many positions "
                             "at a time (dawnpiper_ops.linear_cross_entropy; in --module models, call it yourself)")
    parser.add_argument("--output-chunks", type=int, default=0,
                        help="HF sources: compute the output projection as this many projections over ranges of the "
                             "vocabulary, concatenated (the same logits; cuts can fall between them)")
    parser.add_argument("--keep-activations", action="store_true",
                        help="keep Hugging Face's gelu_new / gelu_fast as written (eight elementwise operators) "
                             "instead of one gelu(approximate='tanh') node")
    parser.add_argument("--dawnpiper", help="the dawnpiper binary that checks the written file (default: $DAWNPIPER_BIN, "
                                            "this checkout's build/dawnpiper, or dawnpiper on PATH)")
    parser.add_argument("--no-check", action="store_true",
                        help="write the file without loading it with dawnpiper's own checks")
    parser.add_argument("--verbose", action="store_true", help="show what torch.export logs")
    args = parser.parse_args(argv)
    binary = None if args.no_check else dawnpiper_binary(args.dawnpiper)
    if args.loss_chunk_tokens < 0 or (args.loss_chunk_tokens and args.module):
        raise UserError("--loss-chunk-tokens takes a positive number of positions, for --hf / --hf-config / --pretrained "
                        "sources (a --module model calls dawnpiper_ops.linear_cross_entropy itself)")
    if args.output_chunks < 0 or (args.output_chunks and args.module):
        raise UserError("--output-chunks takes a positive number of projections, for --hf / --hf-config / --pretrained "
                        "sources (a --module model can compute its projection in parts itself)")
    if args.output_chunks and args.loss_chunk_tokens:
        raise UserError("--output-chunks and --loss-chunk-tokens: the fused loss never holds the logits whole; "
                        "give one of them")
    global VERBOSE
    VERBOSE = args.verbose
    if args.batch_size < 2:
        raise UserError("--batch-size must be at least 2 (torch.export specializes sizes 0 and 1)")
    if args.module:
        wrapper, prefix, inputs, roles, description = module_source(args)
    else:
        wrapper, prefix, inputs, roles, description = hf_source(args)
    program, names, paths = export_program(wrapper, inputs, prefix, args.max_batch)
    check_operators(program, paths, prefix, description["source"])
    names_of = tied_names(wrapper, prefix)
    observed = observe(program, inputs)
    graph_inputs, nodes, weights, batch = build_graph(program, names, prefix, roles, names_of, observed, paths)
    table, tensors = weight_table(program, weights, nodes, prefix, names_of)
    blocks = blocks_of(nodes)
    import torch

    graph = {
        "format": "dawnpiper-model",
        "version": FORMAT_VERSION,
        "exporter": {"torch": torch.__version__, "script": "scripts/export_model.py"},
        "model": description,
        "batch": {"example": args.batch_size, "min": 1, "max": args.max_batch},
        "precision": args.precision,
        "inputs": graph_inputs,
        "weights": table,
        "blocks": blocks,
        "nodes": nodes,
        "loss": nodes[-1]["name"],
    }
    frozen = [n for n, p in wrapper.named_parameters() if not p.requires_grad]
    if frozen:  # the file has no such flag: DawnPiper's optimizer updates every parameter
        names = ", ".join(n[len(prefix):] if n.startswith(prefix) else n for n in frozen[:3])
        print(f"export_model.py: warning: {len(frozen)} parameters PyTorch does not train (requires_grad=False: "
              f"{names}{', ...' if len(frozen) > 3 else ''}) are trained like the others in DawnPiper", file=sys.stderr)
    if binary is None and not args.no_check:
        print("export_model.py: warning: no dawnpiper binary found (build it, or give --dawnpiper or $DAWNPIPER_BIN): "
              "the file is written without the trainer's checks", file=sys.stderr)
    write_model_file(args.out, graph, tensors, binary)
    if args.reference:
        write_reference(args.reference, wrapper, inputs, prefix, args.seed)
    params = sum(t.numel() for e, t in zip(table, tensors.values()) if e["kind"] == "param")
    print(f"wrote {args.out}: {len(nodes)} nodes, {len(blocks)} blocks, {params / 1e6:.2f}M parameters")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"export_model.py: {e}", file=sys.stderr)
        sys.exit(2)
