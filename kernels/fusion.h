// The one switch between lockstep's fused CUDA paths and the unfused ops they
// replace (Note [one fusion switch]): process-wide, on by default. Off, every
// layer runs the composition the fused kernel is held to, so that one build
// can time and compare both ways (bench_step --unfused, lockstep-train
// --unfused-kernels).
#pragma once

namespace lockstep::kernels {

// Note [one fusion switch]: each place that chooses a fused CUDA path asks
// fused_kernels() beside its own conditions (device, dtype, alignment,
// support), and says what it falls back to:
// - cuDNN's fused attention (engine/nn/attention.cpp, Note [fused attention]);
// - the cross-entropy over f16/bf16 logits (engine/nn/loss.cpp, Note
//   [cross-entropy paths]);
// - GPT's residual add + LayerNorm passes (engine/nn/gpt_block.h, Note [fused
//   block]);
// - cuBLASLt's epilogues (kernels/cuda/gemm.cu, Note [gemm epilogues]);
// - BatchNorm with its ReLU or a block's add + ReLU in the autocast type
//   (engine/nn/batchnorm.cpp, Note [batchnorm paths]; Residual's block end).
// The embedding's deferred index check, its gradient order and the
// optimizer's weight copies are not behind it: they change no arithmetic
// (or only the order of one sum, Note [embedding gradient order]). The CPU
// runs the unfused ops whatever the switch says.
void set_fused_kernels(bool on);
bool fused_kernels();

}  // namespace lockstep::kernels
