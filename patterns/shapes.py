"""Shape rules vLLM applies before any call is issued: layer split, vocab padding, graph padding,
prefill chunks. Several engines' profiles (and the weights a rank holds) take them as vLLM
does; vLLM V1's own defaults and capture sizes: `patterns/engines/vllm/rules.py`."""

from typing import NamedTuple

# vLLM's DEFAULT_VOCAB_PADDING_SIZE (model_executor/layers/vocab_parallel_embedding.py).
VOCAB_PADDING = 64
# CUDA-graph batch sizes of vLLM 0.8.5: [1, 2, 4] + list(range(8, 513, 8)) (config.py);
# a decode batch above the largest runs eagerly, unpadded.
MAX_GRAPH_BATCH = 512


def stage_layer_counts(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM's `distributed/utils.py:get_pp_indices` splits them.

    Every stage gets num_layers // pp; the remainder goes one each to stages pp-2, pp-3, ...
    (the last stage, which also holds the LM head, is spared).
    """
    counts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        counts[-i] += 1
    return counts


def padded_vocab(vocab_size: int, multiple: int = VOCAB_PADDING) -> int:
    """`pad_vocab_size`: the vocabulary rounded up to a multiple of 64."""
    return -(-vocab_size // multiple) * multiple


def graph_batch_size(batch: int) -> int:
    """The CUDA-graph capture size a decode batch is padded to: 1, 2, 4, then multiples of 8."""
    if batch > MAX_GRAPH_BATCH:
        return batch
    for size in (1, 2, 4):
        if batch <= size:
            return size
    return -(-batch // 8) * 8


class PrefillChunk(NamedTuple):
    tokens: int  # T of the step
    seqs: int  # prompts with tokens in the step
    rows: int  # prompts whose last token is in the step: the rows it samples


def prefill_chunks(batch: int, prompt: int, budget: int | None) -> list[PrefillChunk]:
    """The prefill steps of a batch of B prompts of Sp tokens.

    Without a budget the whole batch is one step that samples one row per prompt. With
    chunked prefill (`max_num_batched_tokens`) the B*Sp prompt tokens are taken in order,
    `budget` per step; a step samples one row for each prompt whose last token it holds.
    Decodes of prompts finished early are not mixed into later chunks: the batch is taken
    to start decoding together, after its last chunk.
    """
    total = batch * prompt
    if budget is None or budget >= total:
        return [PrefillChunk(total, batch, batch)]
    chunks = []
    for start in range(0, total, budget):
        end = min(start + budget, total)
        # Prompt i holds tokens [i*Sp, (i+1)*Sp); its last one lies in [start, end) when
        # (i+1)*Sp is in [start+1, end].
        finished = end // prompt - start // prompt
        touched = (end - 1) // prompt - start // prompt + 1
        chunks.append(PrefillChunk(end - start, touched, finished))
    return chunks
