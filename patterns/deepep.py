"""DeepEP's dispatch and combine as vLLM V1 drives them (`--a2a deepep_ll` / `deepep_ht`):
what one message carries, in which dtype, with which scales, and how many go to each rank.

Code read:
- vLLM @ c8109375 (modal-projects/vllm), `model_executor/layers/fused_moe/`:
  `all2all_utils.py:205-208`: the low-latency kernels dispatch fp8 when the checkpoint's
  activations quantise to fp8 in 128x128 blocks (DeepSeek-V3's block fp8), else bf16;
  `prepare_finalize/deepep_ll.py:64-80` rounds the hidden size up to a size the kernels
  take (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192); `deepep_ht.py:35-48` rounds the
  hidden bytes up to 512; `deepep_ht.py:288-312` quantises block-fp8 models to fp8 with
  per-128-channel scales *before* the high-throughput dispatch (other quantised models,
  mxfp4 included, dispatch bf16 and quantise after).
- DeepEP (deepseek-ai/DeepEP @ 005dcc9d) `csrc/kernels/internode_ll.cu` `dispatch`: one
  message per (token, top-k expert), sent to that expert's rank even when two of a token's
  experts share a rank; a message is a 16-byte header (source index, 3 reserved ints) and the
  hidden state: h fp8 bytes and h/128 fp32 scales, or 2h bf16 bytes. The low-latency
  combine sends each expert's output back in bf16 (2h bytes per (token, expert)). The
  high-throughput (normal) kernels send a token once to each rank holding one of its
  experts, with its top-k ids (int64) and weights (fp32), and combine in bf16.

Per destination: ceil(max_r T_r * k / n) rows, the expected count under balanced routing
(vLLM's buffers are sized for the largest rank). For the high-throughput kernels this is an
upper bound: a token whose experts share a rank is sent there once. Routing itself (which
depends on the weights) is not modelled.
"""

from patterns.dtypes import dtype_bytes
from patterns.ops import Op, OpKind, Transport

DEEPEP_MODES = ("deepep_ll", "deepep_ht")
LL_HIDDEN_SIZES = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)
HEADER_BYTES = 16  # sizeof(int4): source index and 3 reserved ints
SCALE_BLOCK = 128  # channels per fp8 scale
HT_ATOM_BYTES = 512  # 32 (warp) x 16 B (int4)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def fp8_dispatch(weight_format: str) -> bool:
    """Block-fp8 checkpoints dispatch fp8 (fp8 checkpoints are taken as DeepSeek-V3's 128x128
    blocks; mxfp4 and unquantised ones dispatch bf16)."""
    return weight_format == "fp8"


def padded_hidden(mode: str, hidden: int, dtype: str) -> int:
    if mode == "deepep_ll":
        fits = [s for s in LL_HIDDEN_SIZES if s >= hidden]
        if not fits:
            from patterns.errors import ConfigError
            raise ConfigError(f"hidden size {hidden} exceeds DeepEP low-latency's largest "
                              f"({LL_HIDDEN_SIZES[-1]}); use --a2a deepep_ht")
        return fits[0]
    width = dtype_bytes(dtype)
    return _ceil_div(hidden * width, HT_ATOM_BYTES) * HT_ATOM_BYTES // width


def dispatch_row_bytes(mode: str, hidden: int, top_k: int, dtype: str, fp8: bool) -> int:
    """Bytes one dispatched row carries (one (token, expert) message for low latency, one
    (token, rank) row for high throughput)."""
    h = padded_hidden(mode, hidden, dtype)
    data = h + (h // SCALE_BLOCK) * 4 if fp8 else h * dtype_bytes(dtype)
    if mode == "deepep_ll":
        return HEADER_BYTES + data
    return data + top_k * (8 + 4)  # topk_idx int64 and topk_weights fp32 travel with it




def deepep_ops(prefix: str, ranks: int, max_tokens: int, top_k: int, hidden: int, dtype: str,
               mode: str, weight_format: str) -> list[Op]:
    """The dispatch and combine of one MoE layer over an EP group of `ranks`; rows are
    uint8 messages of the bytes above; the combine of bf16 rows of the padded hidden size;
    `ranks` x per-destination rows each way."""
    rows = ranks * _ceil_div(max_tokens * top_k, ranks)
    message = dispatch_row_bytes(mode, hidden, top_k, dtype, fp8_dispatch(weight_format))
    back = padded_hidden(mode, hidden, dtype)
    return [Op(kind=OpKind.ALLTOALL, group="ep", group_size=ranks, shape=(rows, message),
               out_shape=(rows, message), dtype="uint8", tag=f"{prefix}.dispatch",
               transport=Transport.NVSHMEM),
            Op(kind=OpKind.ALLTOALL, group="ep", group_size=ranks, shape=(rows, back),
               out_shape=(rows, back), dtype="bf16", tag=f"{prefix}.combine",
               transport=Transport.NVSHMEM)]
