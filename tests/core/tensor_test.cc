// Tensor core: dtypes and bf16 rounding, views and copies, contiguity, memory accounting,
// text forms and error messages.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/core/attrs.h"
#include "tessel/core/context.h"
#include "tessel/core/view.h"

namespace tessel {
namespace {

Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return Tensor::from_doubles(v, shape, dtype);
}

TEST(DType, NamesParseAndSizes) {
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  try {
    parse_dtype("f16");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos);
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(static_cast<float>(BFloat16(1.00390625f)), 1.0f);
  // 1 + 3·2^-8 is between 1 + 2^-7 and 1 + 2^-6... the tie goes to the even one (1 + 2^-6).
  EXPECT_EQ(static_cast<float>(BFloat16(1.01171875f)), 1.015625f);
  EXPECT_EQ(static_cast<float>(BFloat16(1.0040f)), 1.0078125f);  // just above the tie rounds up
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
  EXPECT_TRUE(std::isinf(static_cast<float>(BFloat16(INFINITY))));
  for (float f : {0.0f, -2.5f, 3.0e38f, 1e-30f}) {
    float r = static_cast<float>(BFloat16(f));
    EXPECT_LE(std::fabs(r - f), std::fabs(f) * (1.0f / 256.0f)) << f;
  }
}

TEST(Tensor, Bf16TensorRoundTrip) {
  Tensor x = Tensor::from_doubles({0.1, -1.5, 3.0, 1000.25}, {4}, DType::f32);
  Tensor b = view::to_dtype(x, DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  Tensor back = view::to_dtype(b, DType::f32);
  std::vector<double> v = back.to_doubles();
  EXPECT_EQ(v[1], -1.5);
  EXPECT_EQ(v[2], 3.0);
  EXPECT_NEAR(v[0], 0.1, 0.1 / 128);
  EXPECT_NEAR(v[3], 1000.25, 1000.25 / 128);
  // A value representable in bf16 survives the round trip exactly.
  EXPECT_EQ(view::to_dtype(view::to_dtype(back, DType::bf16), DType::f32).to_doubles(), v);
}

TEST(Tensor, FactoriesAndItem) {
  Tensor z = Tensor::zeros({2, 3}, DType::f64);
  EXPECT_EQ(z.numel(), 6);
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(Tensor::full({2}, 2.5).to_doubles(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(Tensor::scalar(4.0).item(), 4.0);
  EXPECT_EQ(Tensor::arange(4).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(z.raw_data()) % kAlignment, 0u);
  EXPECT_THROW(z.item(), Error);
  EXPECT_THROW(z.data<float>(), Error);
  EXPECT_THROW(Tensor::empty({2, -1}), Error);
}

TEST(View, SliceTransposePermute) {
  Tensor x = iota({3, 4});
  Tensor s = view::slice(x, 1, 1, 4, 2);  // columns 1, 3
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_EQ(s.to_doubles(), (std::vector<double>{1, 3, 5, 7, 9, 11}));
  EXPECT_FALSE(s.is_contiguous());
  Tensor t = view::transpose(x, 0, 1);
  EXPECT_EQ(t.shape(), (Shape{4, 3}));
  EXPECT_EQ(t.to_doubles()[1], 4.0);
  EXPECT_EQ(view::slice(x, 0, -2, 3).to_doubles(), (std::vector<double>{4, 5, 6, 7, 8, 9, 10, 11}));
  Tensor p = view::permute(iota({2, 3, 4}), {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.to_doubles()[1], 4.0);  // p[0,0,1] = x[0,1,0]
  EXPECT_EQ(view::select(x, 1, 2).to_doubles(), (std::vector<double>{2, 6, 10}));
}

TEST(View, ReshapeViewsWhenPossibleAndCopiesOtherwise) {
  Tensor x = iota({2, 3, 4});
  auto v = view::try_view(x, {6, 4});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->storage(), x.storage());
  // Permuted dims that stay nested can still be viewed...
  Tensor t = view::transpose(x, 1, 2);                  // [2, 4, 3]
  EXPECT_TRUE(view::try_view(t, {2, 12}).has_value() == false);  // merging the swapped pair needs a copy
  EXPECT_TRUE(view::try_view(t, {1, 2, 4, 3, 1}).has_value());    // adding size-1 dims does not
  Tensor sl = view::slice(x, 2, 0, 2);                  // [2, 3, 2], rows strided by 4
  auto merged = view::try_view(sl, {6, 2});
  ASSERT_TRUE(merged.has_value());
  EXPECT_EQ(merged->to_doubles(), sl.to_doubles());
  Tensor r = view::reshape(t, {2, 12});
  EXPECT_NE(r.storage(), x.storage());
  EXPECT_EQ(r.to_doubles(), view::contiguous(t).to_doubles());
  EXPECT_EQ(view::reshape(x, {-1}).shape(), (Shape{24}));
  EXPECT_THROW(view::reshape(x, {5, -1}), Error);
}

TEST(View, ExpandUnsqueezeAndCopy) {
  Tensor x = iota({3, 1});
  Tensor e = view::expand(x, {2, 3, 4});
  EXPECT_EQ(e.stride(0), 0);
  EXPECT_EQ(e.stride(2), 0);
  EXPECT_EQ(view::contiguous(e).to_doubles()[5], 1.0);  // [0,1,1]
  EXPECT_THROW(view::expand(x, {3, 2, 2}), Error);
  EXPECT_EQ(view::unsqueeze(x, 0).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(view::squeeze(x, 1).shape(), (Shape{3}));
  Tensor dst = Tensor::zeros({2, 3}, DType::i64);
  view::copy(dst, iota({3}, DType::f64));  // broadcasts and converts
  EXPECT_EQ(dst.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
}

TEST(Tensor, ZeroSizedTensors) {
  Tensor x = Tensor::zeros({0, 3});
  EXPECT_EQ(x.numel(), 0);
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_TRUE(x.to_doubles().empty());
  EXPECT_EQ(view::reshape(x, {3, 0}).shape(), (Shape{3, 0}));
  EXPECT_EQ(view::transpose(x, 0, 1).shape(), (Shape{3, 0}));
}

TEST(Tensor, MemoryIsChargedToTheRankThatAllocated) {
  auto ctx = make_rank_context(1, 2, 1);
  {
    RankContextScope scope(ctx);
    Tensor a = Tensor::empty({1024}, DType::f32);
    EXPECT_EQ(ctx->memory->current.load(), 4096);
    {
      Tensor b = Tensor::empty({256}, DType::f64);
      EXPECT_EQ(ctx->memory->peak.load(), 4096 + 2048);
    }
    EXPECT_EQ(ctx->memory->current.load(), 4096);
  }
  EXPECT_EQ(ctx->memory->current.load(), 0);
}

// Per-kind counters: an allocation is charged to the kind of its scope; charging a storage to
// another kind later moves its bytes; each kind keeps its own high-water mark.
TEST(Tensor, MemoryIsChargedByKind) {
  auto ctx = make_rank_context(0, 1, 1);
  RankContextScope scope(ctx);
  const MemoryStats& m = *ctx->memory;
  Tensor p;
  {
    MemoryKindScope params(MemoryKind::params);
    p = Tensor::empty({256}, DType::f32);
  }
  Tensor g = Tensor::empty({512}, DType::f32);
  EXPECT_EQ(m.current_of(MemoryKind::params), 1024);
  EXPECT_EQ(m.current_of(MemoryKind::other), 2048);
  g.storage()->charge_as(MemoryKind::grads);
  EXPECT_EQ(m.current_of(MemoryKind::other), 0);
  EXPECT_EQ(m.current_of(MemoryKind::grads), 2048);
  EXPECT_EQ(m.current.load(), 3072);
  g = Tensor();
  EXPECT_EQ(m.current_of(MemoryKind::grads), 0);
  EXPECT_EQ(m.peak_of(MemoryKind::grads), 2048);
  EXPECT_EQ(m.peak_of(MemoryKind::other), 2048);
  ctx->memory->reset_peak();
  EXPECT_EQ(m.peak_of(MemoryKind::grads), 0);
  EXPECT_EQ(m.peak_of(MemoryKind::params), 1024);
}

// A storage can give its memory back while views of it live on, and take it again.
TEST(Tensor, StorageReleasesAndRestoresItsMemory) {
  auto ctx = make_rank_context(0, 1, 1);
  RankContextScope scope(ctx);
  MemoryKindScope params(MemoryKind::params);
  Tensor t = Tensor::zeros({64}, DType::f32);
  Tensor view = view::slice(t, 0, 8, 16);
  t.storage()->release();
  EXPECT_TRUE(t.storage()->released());
  EXPECT_EQ(ctx->memory->current_of(MemoryKind::params), 0);
  t.storage()->restore();
  EXPECT_EQ(ctx->memory->current_of(MemoryKind::params), 256);
  view::fill(t, 3.0);
  EXPECT_EQ(view.to_doubles(), std::vector<double>(8, 3.0));
  t.storage()->release();
  t = Tensor();
  view = Tensor();  // destroying a released storage frees nothing twice
  EXPECT_EQ(ctx->memory->current.load(), 0);
}

TEST(Tensor, GradModeIsPerRankContext) {
  EXPECT_TRUE(grad_enabled());
  auto ctx = make_rank_context(0, 1, 1);
  {
    RankContextScope scope(ctx);
    NoGradGuard g;
    EXPECT_FALSE(grad_enabled());
  }
  EXPECT_TRUE(grad_enabled());
}

TEST(Attrs, TypedAccessAndMessages) {
  Attrs a{{"dim", int64_t{1}}, {"eps", 1e-5}, {"keep", true}, {"dims", std::vector<int64_t>{0, 2}}};
  EXPECT_EQ(a.i("dim"), 1);
  EXPECT_EQ(a.f("dim"), 1.0);
  EXPECT_TRUE(a.b("keep"));
  EXPECT_EQ(a.str(), "dim=1, eps=1e-05, keep=true, dims=[0,2]");
  try {
    a.i("missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos);
  }
  EXPECT_THROW(a.b("dim"), Error);
}

TEST(Shape, BroadcastAndSplits) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}, "t"), (Shape{2, 3, 4}));
  EXPECT_THROW(broadcast_shapes({2, 3}, {4}, "t"), Error);
  // numpy array_split: 10 into 4 -> 3, 3, 2, 2
  EXPECT_EQ(split_size(10, 4, 0), 3);
  EXPECT_EQ(split_size(10, 4, 3), 2);
  EXPECT_EQ(split_offset(10, 4, 2), 6);
  EXPECT_EQ(split_offset(10, 4, 3), 8);
  EXPECT_EQ(parse_shape("8,6"), (Shape{8, 6}));
  EXPECT_EQ(parse_shape("[2, 3]"), (Shape{2, 3}));
  EXPECT_THROW(parse_shape("8,-1"), Error);
}

}  // namespace
}  // namespace tessel
