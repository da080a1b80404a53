"""Kernel classes from kernel names (MFU.md 2.6): ordered regexes, first match wins.

Order matters: communication first (so DeepEP ``dispatch`` kernels are not read as compute),
then copies, then attention before conv and GEMM (FlashAttention-3 and DeepGEMM are both
``cutlass::device_kernel<...>``; FA3's ``PostprocessConvertdQ`` would hit a naive ``conv``),
then conv, GEMM (a GEMM with a fused SwiGLU epilogue stays a GEMM), fused activations and RoPE
(``rotary_embedding_kernel`` is elementwise work, no embedding lookup), and the rest.
Classification runs once per distinct name, not per event.
"""

from __future__ import annotations

import re
from functools import lru_cache

_RULES: tuple[tuple[str, str], ...] = (
    ("comm", r"^nccl|nccl(dev)?kernel|rccl|ep::(internode|intranode)(_ll)?::|notify_dispatch|notify_combine"
             r"|cached_notify|cross_device_reduce|userbuffers|multimem|nvshmem|all_?reduce_kernel|one_?shot_all_?reduce|two_?shot_all_?reduce"),
    ("memcpy", r"^memcpy|^memory_copy|__amd_rocclr_copybuffer|^copy_(htod|dtoh|dtod|ptop)"),
    ("memset", r"^memset|__amd_rocclr_fillbuffer|^memory_fill"),
    ("attention", r"flash_fwd|flash_bwd|flash::|flashattn|fmha|attn_fwd|attn_bwd|sdpa|mha_(fwd|bwd)"
                  r"|compute_attn|paged_attention|unified_attention|flex_attention|attention_kernel|triton_tem_fused_.*attention"
                  # custom attention: SageAttention (qk_int_sv_f8_attn_kernel), FlashInfer (BatchPrefillWithPagedKVCache,
                  # SingleDecodeWithKVCache, POD, BatchMLAPagedAttention), FlashAttention-4 (cute FlashAttentionForwardSm100),
                  # TensorRT-LLM (masked_multihead_attention, XQA kernel_mha), xformers / mem-efficient, and the Triton
                  # prefill/decode kernels of SGLang and vLLM (_fwd_kernel, _fwd_grouped_kernel_stage1)
                  r"|qk_int\d*_sv_f\d+|with(paged|ragged)?kvcache|pagedattention|flash_?attention|multihead_attention"
                  r"|xqa_?kernel|kernel_mha|efficient_attention|^_fwd_(grouped_)?kernel(_stage\d)?$"),
    ("conv", r"convolution|conv[123]d|_conv_|implicit_?gemm|fprop|dgrad|wgrad|igemm_(fwd|bwd|wrw)|winograd"
             r"|miopen|grouped_conv|scudnn|cudnn_conv|xmma_.*conv|computeoffsetskernel|computeboffsetskernel|fft2d_[rc]2[rc]"),
    ("gemm", r"gemm|nvjet|cutlass.*(tensorop)|cublas|s16816|h16816|s884|h884|s1688|h1688|cijk_|wvsplitk"
             r"|kernel_gemm_xdl|ck::.*gemm|deep_gemm|splitkreduce|fused_moe_kernel|fmoe|moegemm|moe_gemm|triton_tem_|_mm_kernel|matmul"
             r"|^bmm_"),  # TensorRT-LLM's batched (MoE) GEMMs, their epilogue named too: bmm_..._swiGlu_..._sm100f
    # fused activations and rotary position embeddings (RoPE) are elementwise work; before the
    # lookups (rotary_embedding_kernel is no table lookup), routing and quantization patterns
    ("elementwise", r"rotary|(?<![a-z])rope(?![a-z])|rope_(fwd|bwd|forward|backward|kernel)|apply_?rope"
                    r"|swiglu|geglu|reglu|_and_mul|gated_act"),
    # FBGEMM/TorchRec: lookups, their inputs' permutes and checks (KeyedJaggedTensor), the pooled
    # embeddings' permute; torch's EmbeddingBag and the embedding backward's segment kernels
    ("embedding", r"split_embedding|embedding_bag|embeddingbag|embedding_(forward|backward)|embedding_dense|indices_weights"
                  r"|permute_pooled_embs|pooled_embs|permute_[12]d_(data|lengths|indices|weights)|bounds_check_indices"
                  r"|_offsets_range|bucketize_sparse|krn_partials_per_segment|krn_partial_segment_offset|compute_grad_weight"
                  r"|compute_num_of_partial_segments|embedding_renorm"),
    ("moe_routing", r"topk|moe_align|unpermute|permute|moesorting|routing|expert"),
    ("norm", r"layer_?norm|ln_(fwd|bwd)|rms_?norm|batch_?norm|group_?norm|instance_?norm|bn_(fw|bw)"
             r"|gammabeta|rowwisemoments|computefusedparams|computeinternalgradients|computebackwardfusedparams"),  # torch's LN/GN
    ("softmax_reduce", r"softmax|reduce_kernel|reduction|cross_entropy|nll_loss|classnllcriterion|triton_red_|triton_per_|_reduce_|argmax|cumsum|logsumexp"),
    ("optimizer", r"multi_tensor_apply|adam|fusedoptimizer|_fused_sgd|lamb_|lamb_kernel|sgd_kernel"),
    ("cast_quant", r"(?<!no)cast|fp8|quant|amax|to_copy"),  # not "gpu_kernel_impl_nocast"
    ("copy", r"catarraybatchedcopy|direct_copy|copy_kernel|transpose|contiguous|_copy_|memcpy_kernel|nchwtonhwc|nhwctonchw"
             r"|store_kvcache|reshape_and_cache"),
    ("elementwise", r"elementwise|vectorized|unrolled|index|gather|scatter|triton_poi_|fill_kernel|pointwise|activation|relu|gelu|silu|dropout|where"
                    r"|scalepackedtensor|subtensorop"),  # cuDNN's scaling of a result
)
# Names are lower-cased once and the (lower-case) patterns matched case-sensitively: faster.
_COMPILED = tuple((cls, re.compile(p)) for cls, p in _RULES)
assert all(p == p.lower() for _, p in _RULES)

# GPU categories in Kineto that always mean a copy or a fill, whatever the name says.
_CAT_CLASS = {"gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset"}


@lru_cache(maxsize=65536)
def classify(name: str, cat: str | None = None) -> str:
    """Return the kernel class of a GPU activity from its name (and category)."""
    if cat is not None:
        c = _CAT_CLASS.get(cat.lower())
        if c:
            return c
    # FBGEMM's namespace says "gemm" on every kernel it ships (embedding lookups, permutes,
    # quantizers): classify by the rest of the name
    low = name.lower().replace("fbgemm_gpu::", "").replace("fbgemm::", "")
    for cls, rx in _COMPILED:
        if rx.search(low):
            return cls
    return "other"


_COLL_KERNEL = re.compile(
    r"(allreduce|all_reduce|allgather|all_gather|reducescatter|reduce_scatter|alltoall|all_to_all|sendrecv|send|recv|broadcast|reduce)",
    re.IGNORECASE,
)


# DeepEP's kernels (``deep_ep::intranode::dispatch<8, 768, 8192>``, ``deep_ep::internode_ll::combine<...>``,
# ``deep_ep::intranode::notify_dispatch<8>``, ``cached_notify_combine``, internode ``cached_notify``) and
# other expert-parallel kernels named for dispatch/combine: token dispatch and combine are all-to-alls;
# the notify kernels exchange the token counts before them.
_EP_KERNEL = re.compile(r"(?:^|[^a-z])(?:cached_)?(notify_dispatch|notify_combine|notify|dispatch|combine)(?:_?kernel)?(?:<|\(|$)")
_EP_PHASE = {"dispatch": "dispatch", "combine": "combine", "notify_dispatch": "notify", "notify_combine": "notify",
             "notify": "notify"}
# NVSHMEM's on-stream collectives (``nvshmemi_..._alltoall...``, ``fcollect`` = all-gather, ``barrier``,
# ``sync_all``) and PyTorch's NVSHMEM all-to-all-v (``c10d::nvshmem_extension::allToAllV``)
_NVSHMEM_COLL = re.compile(r"(alltoall|fcollect|allgather|broadcast|bcast|reducescatter|reduce_scatter|allreduce|reduce"
                           r"|barrier|sync_all)")
_NVSHMEM_PHASE = {"fcollect": "allgather", "bcast": "broadcast", "sync_all": "barrier", "reduce_scatter": "reducescatter"}


def collective_from_kernel(name: str) -> str | None:
    """The collective a communication kernel's name tells (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``,
    ``multimem_all_reduce_kernel``); None where the name does not say (RCCL ``Generic``)."""
    low = name.lower()
    if "generic" in low:
        return None
    if "cross_device_reduce" in low:  # vLLM's custom all-reduce
        return "allreduce"
    ep = _EP_KERNEL.search(low)  # MoE expert-parallel all-to-alls (DeepEP, NVSHMEM-based): by their phase
    if ep:
        return _EP_PHASE[ep.group(1)]
    if "nvshmem" in low:
        m = _NVSHMEM_COLL.search(low)
        if m:
            return _NVSHMEM_PHASE.get(m.group(1), m.group(1))
    m = _COLL_KERNEL.search(name)
    if not m:
        return None
    from tracelens.model.collectives import normalize_collective

    return normalize_collective(m.group(1))
