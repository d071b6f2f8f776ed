"""Writing a synthetic GGUF one tensor at a time: the parts make_model.py (deepseek2/32) and
make_v4.py (deepseek4) share. Each tensor's bytes come from its own generator, keyed by
(seed, tensor name, chunk), so they depend on neither chunking nor the split count.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.gguf_writer import WriterState

from hybrid.gguf.quant_types import Q, tensor_nbytes
from hybrid.synth.vocab import Vocab
from hybrid.tokenizer.bundled_templates import load_template

CHUNK_ELEMENTS = 1 << 26  # elements generated at once (64 M: ~256 MB of fp32 temporaries)


def tensor_rng(seed: int, name: str, chunk: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode()), chunk])


def random_matrix_chunks(seed: int, name: str, qtype: int, shape: tuple[int, ...], std: float
                         ) -> Iterator[np.ndarray]:
    """A 2-D (or stacked) tensor's random rows in file order, CHUNK_ELEMENTS at a time. Chunk
    boundaries depend only on the shape, so the bytes depend only on (seed, name)."""
    from cpu_kernels.formats.random_blocks import random_rows

    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    per_chunk = max(1, CHUNK_ELEMENTS // cols)
    for chunk, start in enumerate(range(0, rows, per_chunk)):
        yield random_rows(tensor_rng(seed, name, chunk), qtype, min(per_chunk, rows - start),
                          cols, std)


def write_streamed(writer: GGUFWriter, chunks: Iterator[np.ndarray]) -> None:
    """Write the next tensor's data from chunks (gguf's write_tensor_data wants one array)."""
    assert writer.fout is not None
    file_id = next(i for i, t in enumerate(writer.tensors) if t)
    fout = writer.fout[file_id]
    name = next(iter(writer.tensors[file_id]))
    info = writer.tensors[file_id].pop(name)
    writer.write_padding(fout, fout.tell())
    written = 0
    for chunk in chunks:
        chunk.tofile(fout)
        written += chunk.nbytes
    if written != info.nbytes:
        raise RuntimeError(f"{name}: wrote {written} bytes, expected {info.nbytes}")
    writer.write_padding(fout, written)
    writer.state = WriterState.WEIGHTS


def extend_sparse(writer: GGUFWriter) -> None:
    """Give every file its full size without writing data (tensors are padded to alignment)."""
    assert writer.fout is not None
    align = writer.data_alignment
    for fout, tensors in zip(writer.fout, writer.tensors):
        start = GGUFWriter.ggml_pad(fout.tell(), align)
        size = start + sum(GGUFWriter.ggml_pad(ti.nbytes, align) for ti in tensors.values())
        fout.truncate(size)
        tensors.clear()
    writer.close()


def add_tensor_infos(writer: GGUFWriter, shapes: dict[str, tuple[int, ...]],
                     types: dict[str, int]) -> None:
    """Declare every tensor (numpy-order shape, ggml type) before any data is written."""
    for name, shape in shapes.items():
        qtype = types[name]
        nbytes = tensor_nbytes(qtype, int(np.prod(shape)))
        np_dtype = {Q.F32: np.float32, Q.F16: np.float16, Q.I32: np.int32}.get(qtype, np.uint8)
        # gguf wants ggml's shape for plain element types and the byte shape for raw data
        if np_dtype is np.uint8:
            byte_shape = (*shape[:-1], nbytes // int(np.prod(shape[:-1])))
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=Q(qtype))
        else:
            writer.add_tensor_info(name, shape, np.dtype(np_dtype), nbytes)


def add_tokenizer(w: GGUFWriter, vocab: Vocab, chat_template: str | None,
                  write_template: bool = True) -> None:
    """The tokenizer keys (gpt2 BPE, as the converters write DeepSeek's), and, with
    `write_template`, the vocabulary's chat template or `chat_template` (a bundled name or a
    .jinja file)."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos_token_id)
    w.add_eos_token_id(vocab.eos_token_id)
    w.add_pad_token_id(vocab.pad_token_id)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if write_template:
        w.add_chat_template(vocab.chat_template if chat_template is None
                            else load_template(chat_template))


def write_model(writer: GGUFWriter, out: Path, shapes: dict[str, tuple[int, ...]],
                types: dict[str, int], chunks: Callable[[str, tuple[int, ...], int],
                                                        Iterator[np.ndarray]],
                header_only: bool, progress: Callable[[str, int, int], None] | None
                ) -> list[Path]:
    """Declare the tensors, write header, keys and tensor infos (the keys already added), then
    each tensor's `chunks(name, shape, qtype)` (or, header_only, a sparse hole of the full
    size); close. Returns the files (split parts are named from `out`)."""
    add_tensor_infos(writer, shapes, types)
    files = writer.format_shard_names(out)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    if header_only:
        extend_sparse(writer)
        return files
    total = sum(tensor_nbytes(types[n], int(np.prod(s))) for n, s in shapes.items())
    done = 0
    for name, shape in shapes.items():
        write_streamed(writer, chunks(name, shape, types[name]))
        done += tensor_nbytes(types[name], int(np.prod(shape)))
        if progress is not None:
            progress(name, done, total)
    writer.close()
    return files
