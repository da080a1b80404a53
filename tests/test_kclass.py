"""Kernel classes from kernel names (tracelens.model.kclass) and their colours (views.KCLASS_COLOURS)."""

from __future__ import annotations

import itertools
import math

import polars as pl
import pytest

from tests.conftest import real_traces
from tracelens.model.kclass import classify
from tracelens.model.schema import KCLASSES
from tracelens.render.tables import KCLASS_COLOURS
from tracelens.store.job import load


@pytest.mark.parametrize(
    "name,cls",
    [
        # TorchRec / FBGEMM embedding pipelines: the pooled embeddings' and sparse features' permutes
        # and the lookups' input checks are embedding work, not MoE token routing
        ("void permute_pooled_embs_kernel<float>(float const*, long const*, long const*, long const*, float*, long, long, long)",
         "embedding"),
        ("void fbgemm_gpu::permute_2D_data_kernel<false, int, int, decltype(nullptr)>(int, int, int, int const*)", "embedding"),
        ("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)", "embedding"),
        ("void bounds_check_indices_kernel<long, false>(at::GenericPackedTensorAccessor<long, 1ul>)", "embedding"),
        ("void fbgemm_gpu::_offsets_range_cuda_kernel<int>(long, long, int const*, int*)", "embedding"),
        ("void fbgemm_gpu::permute_indices_weights_kernel<false, int, decltype(nullptr)>(int, int)", "embedding"),
        ("void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float>", "embedding"),
        # torch.nn.EmbeddingBag / nn.Embedding backward
        ("void at::native::(anonymous namespace)::EmbeddingBag_updateOutputKernel_sum_mean<float, long>", "embedding"),
        ("void at::native::(anonymous namespace)::krn_partials_per_segment<long>(long*, long const*, long, long)", "embedding"),
        ("void at::native::(anonymous namespace)::compute_grad_weight<float, long>(long const*, float const*)", "embedding"),
        # rotary position embeddings (RoPE): elementwise, not "other" (and not a table lookup)
        ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*)", "elementwise"),
        ("void rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*)", "elementwise"),
        ("void vllm::batched_rotary_embedding_kernel<c10::Half, false>(long const*, c10::Half*)", "elementwise"),
        ("void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u, 8u, 16u, __nv_bfloat16, long>", "elementwise"),
        ("void transformer_engine::fused_rope_forward_kernel<__nv_bfloat16>(__nv_bfloat16 const*, float const*)", "elementwise"),
        ("_rotary_kernel", "elementwise"),
        ("_triton_rope", "elementwise"),
        ("void sgl_kernel::apply_rope_pos_ids_cos_sin_cache_kernel<__nv_bfloat16>", "elementwise"),
        # fused gated activations (SwiGLU, GeGLU, act-and-mul): elementwise
        ("void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::gelu_tanh_kernel<c10::BFloat16>), true>", "elementwise"),
        ("void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>(__nv_bfloat16*, __nv_bfloat16 const*, int)",
         "elementwise"),
        ("_swiglu_forward_kernel", "elementwise"),
        ("_geglu_tanh_backward_kernel", "elementwise"),
        ("void transformer_engine::dgated_act_kernel<dswiglu<float, float>>", "elementwise"),
        ("void vllm::swigluoai_and_mul_kernel<c10::BFloat16>", "elementwise"),
        ("void vllm::silu_and_mul_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn>", "elementwise"),
        # ... but a GEMM whose epilogue applies SwiGLU is a GEMM (TensorRT-LLM's batched MoE GEMMs on B200)
        ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_schedP2x1x2x3_biasM_bN_tma"
         "_tmaOpt_clmp_swiGlu_dynBatch_sm100f", "gemm"),
        ("bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_schedP2x1x2x3_biasM_bN"
         "_tmaOpt_clmp_dynBatch_sm100f", "gemm"),
        # the cases that must stay what they were
        ("void fbgemm_gpu::permute_indices_weights_kernel<true, int, float>(int, int)", "embedding"),
        ("void moe::dev::routing::routingIndicesHistogramKernel<moe::dev::routing::routingRenormalize::KernelParams>",
         "moe_routing"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel>", "elementwise"),
        ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>", "elementwise"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>", "copy"),
    ],
)
def test_kernel_classes(name, cls):
    assert classify(name) == cls


@pytest.mark.parametrize("path,pattern,want", [
    # TorchRec DLRM training (A100): 23.6 ms of permute_pooled_embs and 9.5 ms of permute_2D
    # kernels were filed under moe_routing in a model without experts
    ("hta/trace_diff/control/control.json.gz", r"(?i)permute_pooled_embs|permute_2d_|bounds_check_indices", "embedding"),
    # vLLM on B200: RoPE kernels were "other"
    ("amd-tracelens/b200/eager_trace.json.gz", r"(?i)rotary", "elementwise"),
])
def test_real_traces_kernel_classes(path, pattern, want):
    ev = load([real_traces() / path], use_cache=False).events().collect()
    k = ev.filter((pl.col("kind") == "kernel") & pl.col("name").cast(pl.String).str.contains(pattern))
    assert k.height > 0
    assert set(k.get_column("kclass").cast(pl.String).unique()) == {want}


def _lab(hex_colour: str) -> tuple[float, float, float]:
    """sRGB hex -> CIE L*a*b* (D65), to measure how far apart two colours look."""
    def lin(c: float) -> float:
        return ((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92

    r, g, b = (lin(int(hex_colour[i:i + 2], 16) / 255) for i in (1, 3, 5))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def test_every_kernel_class_has_its_own_colour():
    """Every class has a colour (the HTML timeline and the TUI fall back to one grey otherwise),
    and no two look alike: CIE76 distance at least 25 (about 2.3 is the just-noticeable
    difference; GEMM and conv were 9 apart, two blues one could not tell apart in a timeline
    cell), and distinct in a 256-colour terminal, where Textual downgrades them."""
    from rich.color import Color, ColorSystem

    assert set(KCLASSES) <= set(KCLASS_COLOURS)
    colours = {c: KCLASS_COLOURS[c] for c in KCLASSES}
    close = [(a, b, round(math.dist(_lab(colours[a]), _lab(colours[b])), 1)) for a, b in itertools.combinations(KCLASSES, 2)
             if math.dist(_lab(colours[a]), _lab(colours[b])) < 25]
    assert not close
    eight_bit = {c: Color.parse(v).downgrade(ColorSystem.EIGHT_BIT).number for c, v in colours.items()}
    assert len(set(eight_bit.values())) == len(KCLASSES)
