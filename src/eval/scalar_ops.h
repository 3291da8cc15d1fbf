// One scalar definition per elementwise op, shared by every evaluator (the tile loops in
// elementwise.cpp lift them; constant folding and the GPU emitter's tests use them too).
//
// Functors take and return the *compute* type: the element type itself, except float16 and
// bfloat16, which compute in float and are rounded back by the tile loop. Integer arithmetic
// wraps (done in the unsigned type: no UB); division, remainder and shifts follow XLA (see the
// semantics at the top of include/pallas/ir/ir.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "pallas/dtype.h"

namespace pallas::eval::scalar {

template <class T> struct ComputeOf { using type = T; };
template <> struct ComputeOf<float16> { using type = float; };
template <> struct ComputeOf<bfloat16> { using type = float; };
template <class T> using Compute = typename ComputeOf<T>::type;

template <class T> inline constexpr bool is_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;
template <class T> inline constexpr bool is_float_v = std::is_floating_point_v<T>;

template <class T> using Unsigned = std::make_unsigned_t<T>;

// ---- Unary --------------------------------------------------------------------------------------
struct Neg {
  template <class T>
    requires(!std::is_same_v<T, bool>)
  T operator()(T x) const {
    if constexpr (is_int_v<T>) return static_cast<T>(Unsigned<T>(0) - static_cast<Unsigned<T>>(x));
    else return -x;
  }
};
struct Abs {
  template <class T>
    requires(!std::is_same_v<T, bool>)
  T operator()(T x) const {
    if constexpr (is_int_v<T> && std::is_signed_v<T>)
      return x < 0 ? static_cast<T>(Unsigned<T>(0) - static_cast<Unsigned<T>>(x)) : x;
    else if constexpr (is_int_v<T>) return x;
    else return std::fabs(x);
  }
};
struct Sign {
  template <class T>
    requires(!std::is_same_v<T, bool>)
  T operator()(T x) const {
    if constexpr (is_int_v<T>) return static_cast<T>((x > 0) - (x < T(0)));
    else if (std::isnan(x) || x == 0) return x;  // NaN stays NaN; ±0 keeps its sign
    else return std::copysign(T(1), x);
  }
};
struct Floor { template <class T> T operator()(T x) const { return std::floor(x); } };
struct Ceil { template <class T> T operator()(T x) const { return std::ceil(x); } };
struct RoundAway { template <class T> T operator()(T x) const { return std::round(x); } };
struct RoundEven { template <class T> T operator()(T x) const { return std::nearbyint(x); } };
struct Exp { template <class T> T operator()(T x) const { return std::exp(x); } };
struct Exp2 { template <class T> T operator()(T x) const { return std::exp2(x); } };
struct Log { template <class T> T operator()(T x) const { return std::log(x); } };
struct Log1p { template <class T> T operator()(T x) const { return std::log1p(x); } };
struct Sqrt { template <class T> T operator()(T x) const { return std::sqrt(x); } };
struct Rsqrt { template <class T> T operator()(T x) const { return T(1) / std::sqrt(x); } };
struct Reciprocal { template <class T> T operator()(T x) const { return T(1) / x; } };
struct Tanh { template <class T> T operator()(T x) const { return std::tanh(x); } };
struct Logistic {
  // Stable on both sides: never exp of a large positive number.
  template <class T> T operator()(T x) const {
    if (x >= 0) return T(1) / (T(1) + std::exp(-x));
    T e = std::exp(x);
    return e / (T(1) + e);
  }
};
struct Sin { template <class T> T operator()(T x) const { return std::sin(x); } };
struct Cos { template <class T> T operator()(T x) const { return std::cos(x); } };
struct Erf { template <class T> T operator()(T x) const { return std::erf(x); } };
struct Not {
  template <class T> T operator()(T x) const {
    if constexpr (std::is_same_v<T, bool>) return !x;
    else return static_cast<T>(~x);
  }
};
struct IntegerPow {
  int64_t n;
  template <class T>
    requires(!std::is_same_v<T, bool>)
  T operator()(T x) const {
    uint64_t e = n < 0 ? static_cast<uint64_t>(-(n + 1)) + 1 : static_cast<uint64_t>(n);
    if constexpr (is_int_v<T>) {
      using U = Unsigned<T>;
      U base = static_cast<U>(x), acc = 1;
      for (; e; e >>= 1, base = static_cast<U>(base * base))
        if (e & 1) acc = static_cast<U>(acc * base);
      return static_cast<T>(acc);
    } else {
      T base = x, acc = 1;
      for (; e; e >>= 1, base *= base)
        if (e & 1) acc *= base;
      return n < 0 ? T(1) / acc : acc;
    }
  }
};

// ---- Binary -------------------------------------------------------------------------------------
struct Add {
  template <class T>
    requires(!std::is_same_v<T, bool>)
  T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) return static_cast<T>(static_cast<Unsigned<T>>(a) + static_cast<Unsigned<T>>(b));
    else return a + b;
  }
};
struct Sub {
  template <class T>
    requires(!std::is_same_v<T, bool>)
  T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) return static_cast<T>(static_cast<Unsigned<T>>(a) - static_cast<Unsigned<T>>(b));
    else return a - b;
  }
};
struct Mul {
  template <class T>
    requires(!std::is_same_v<T, bool>)
  T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) {
      using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, Unsigned<T>>;  // no promotion to int
      return static_cast<T>(static_cast<U>(static_cast<Unsigned<T>>(a)) * static_cast<U>(static_cast<Unsigned<T>>(b)));
    } else {
      return a * b;
    }
  }
};
struct Div {
  template <class T>
    requires(!std::is_same_v<T, bool>)
  T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) {
      if (b == 0) return static_cast<T>(~Unsigned<T>(0));  // all bits set
      if constexpr (std::is_signed_v<T>)
        if (a == std::numeric_limits<T>::min() && b == -1) return a;
      return static_cast<T>(a / b);
    } else {
      return a / b;
    }
  }
};
struct Rem {
  template <class T>
    requires(!std::is_same_v<T, bool>)
  T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) {
      if (b == 0) return a;
      if constexpr (std::is_signed_v<T>)
        if (b == -1) return 0;  // also INT_MIN % -1
      return static_cast<T>(a % b);
    } else {
      return std::fmod(a, b);
    }
  }
};
struct Pow { template <class T> T operator()(T a, T b) const { return std::pow(a, b); } };
struct Max {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a || b;
    else if constexpr (is_int_v<T>) return a > b ? a : b;
    else {
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      if (a == b) return std::signbit(a) ? b : a;  // max(-0, +0) = +0
      return a > b ? a : b;
    }
  }
};
struct Min {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a && b;
    else if constexpr (is_int_v<T>) return a < b ? a : b;
    else {
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      if (a == b) return std::signbit(a) ? a : b;  // min(-0, +0) = -0
      return a < b ? a : b;
    }
  }
};
struct And {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a && b;
    else return static_cast<T>(a & b);
  }
};
struct Or {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a || b;
    else return static_cast<T>(a | b);
  }
};
struct Xor {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a != b;
    else return static_cast<T>(a ^ b);
  }
};
// Shift amounts are read as unsigned: negative amounts are "too large".
struct ShiftLeft {
  template <class T> T operator()(T a, T b) const {
    using U = Unsigned<T>;
    if (static_cast<U>(b) >= sizeof(T) * 8) return 0;
    using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<W>(static_cast<U>(a)) << static_cast<U>(b));
  }
};
struct ShiftRightLogical {
  template <class T> T operator()(T a, T b) const {
    using U = Unsigned<T>;
    if (static_cast<U>(b) >= sizeof(T) * 8) return 0;
    return static_cast<T>(static_cast<U>(a) >> static_cast<U>(b));
  }
};
struct ShiftRightArithmetic {
  template <class T> T operator()(T a, T b) const {
    using U = Unsigned<T>;
    using S = std::make_signed_t<T>;
    S sa = static_cast<S>(a);
    if (static_cast<U>(b) >= sizeof(T) * 8) return static_cast<T>(sa < 0 ? S(-1) : S(0));
    return static_cast<T>(sa >> static_cast<U>(b));
  }
};

// ---- Comparisons (return bool) ------------------------------------------------------------------
struct Eq { template <class T> bool operator()(T a, T b) const { return a == b; } };
struct Ne { template <class T> bool operator()(T a, T b) const { return a != b; } };
struct Lt { template <class T> bool operator()(T a, T b) const { return a < b; } };
struct Le { template <class T> bool operator()(T a, T b) const { return a <= b; } };
struct Gt { template <class T> bool operator()(T a, T b) const { return a > b; } };
struct Ge { template <class T> bool operator()(T a, T b) const { return a >= b; } };

// ---- Conversion (the `convert` op's rules) ------------------------------------------------------
template <class To, class From> To convert_value(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<From, float16> || std::is_same_v<From, bfloat16>) {
    return convert_value<To>(static_cast<float>(x));
  } else if constexpr (std::is_same_v<To, bool>) {
    return x != From(0);  // NaN -> true
  } else if constexpr (std::is_same_v<To, float16> || std::is_same_v<To, bfloat16>) {
    if constexpr (std::is_same_v<From, bool>) return To(x ? 1.0f : 0.0f);
    else if constexpr (is_float_v<From>) return To(x);  // one rounding from float or double
    else {
      // Integers: exact in double below 2^53; larger ones overflow f16 anyway, and for bf16 the
      // single-rounding Scalar path is exact.
      if (static_cast<double>(x) < 9007199254740992.0 && static_cast<double>(x) > -9007199254740992.0)
        return To(static_cast<double>(x));
      Scalar s = std::is_signed_v<From> ? Scalar::of_int(static_cast<int64_t>(x), dtype_of<From>())
                                        : Scalar::of_uint(static_cast<uint64_t>(x), dtype_of<From>());
      return To(s.convert_to(dtype_of<To>()).f);  // already rounded once: exact
    }
  } else if constexpr (is_int_v<To> && is_float_v<From>) {
    // Truncate toward zero, NaN -> 0, saturate out of range (no UB).
    if (std::isnan(x)) return 0;
    constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
    constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
    double d = static_cast<double>(x);
    if (d >= hi) return std::numeric_limits<To>::max();
    if (d <= lo) return std::numeric_limits<To>::min();
    return static_cast<To>(d);
  } else {
    return static_cast<To>(x);  // int -> int wraps (C++20), int/bool -> float rounds to nearest
  }
}

}  // namespace pallas::eval::scalar
