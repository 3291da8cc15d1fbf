// The IR text form, printing side. One generic syntax for every op (driven by the names in
// ops.def and PALLAS_ATTRS), so a new op or attribute needs no printer change:
//
//   kernel @name(%0: ref<f32[8,128], vmem>, %1: i32[]) loc("f.cc":3:5) {
//     %2 = load(%0) {index = [ds(0, 8), ds($1, 128)]} : f32[8,128] loc("f.cc":4:7)
//     %3, %4 = for(%a, %b, %c) ({
//     ^(%5: i32[], %6: f32[8]):
//       yield(%6)
//     }) : f32[8]
//   }
//
// Value names are renumbered densely in the order they appear in the text (parameters, then
// each op's results, then its regions' arguments and ops), so the text does not depend on the
// internal ValueIds and the parser, which allocates ids in text order, reproduces it exactly.
// The grammar is documented in parser.cpp. Printing never throws on a malformed kernel (it is
// a debugging aid): undefined or out-of-range values print as "%?<id>", which the parser rejects.
#include <bit>
#include <cctype>
#include <cstring>

#include "pallas/ir/ir.h"

namespace pallas::ir {

namespace {

// Bare kernel names need no quotes; anything else is printed as a quoted string.
bool is_bare_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  return true;
}

void append_quoted(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        // Other control bytes would make the text hard to read (or break lines); bytes >= 0x80
        // pass through unchanged so UTF-8 stays readable and every byte string round-trips.
        if (c < 0x20 || c == 0x7f) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// The dtype-width bit pattern of s (the value as store_to writes it), as an integer.
uint64_t element_bits(const Scalar& s) {
  unsigned char buf[8] = {};
  s.store_to(buf);
  uint64_t bits = 0;
  const int n = itemsize(s.dtype);
  for (int i = 0; i < n; ++i) {
    const int byte = std::endian::native == std::endian::little ? i : n - 1 - i;
    bits |= uint64_t{buf[byte]} << (8 * i);
  }
  return bits;
}

std::string hex(uint64_t bits, int digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += kHex[(bits >> (4 * i)) & 15];
  return s;
}

// Scalars print as Scalar::to_string when that reads back bit for bit; otherwise (NaNs with a
// sign or payload, values a Scalar holds outside its dtype's range) as a hex bit pattern: the
// dtype's width when the element bits reproduce the Scalar, else the 16 digits of its raw
// 64-bit storage. The parser tells the two apart by the digit count.
std::string scalar_text(const Scalar& s) {
  std::string text = s.to_string();
  try {
    if (Scalar::parse(text, s.dtype).bitwise_equal(s)) return text;
  } catch (const Error&) {
  }
  const int n = itemsize(s.dtype);
  const uint64_t bits = element_bits(s);
  unsigned char buf[8] = {};
  for (int i = 0; i < n; ++i) {
    const int byte = std::endian::native == std::endian::little ? i : n - 1 - i;
    buf[byte] = static_cast<unsigned char>(bits >> (8 * i));
  }
  if (Scalar::load_from(buf, s.dtype).bitwise_equal(s)) return hex(bits, 2 * n);
  return hex(s.u, 16);
}

class Printer {
 public:
  Printer(const Kernel& k, const PrintOptions& opts)
      : k_(k), opts_(opts), names_(k.values.size(), -1) {}

  std::string run() {
    out_ += "kernel @";
    if (is_bare_name(k_.name))
      out_ += k_.name;
    else
      append_quoted(out_, k_.name);
    out_ += '(';
    for (size_t i = 0; i < k_.body.args.size(); ++i) {
      if (i) out_ += ", ";
      typed_def(k_.body.args[i]);
    }
    out_ += ')';
    loc(k_.loc);
    out_ += " {\n";
    for (const Op& op : k_.body.ops) print_op(op, 2);
    out_ += "}\n";
    return std::move(out_);
  }

 private:
  void define(ValueId v) {
    if (v >= 0 && static_cast<size_t>(v) < names_.size() && names_[v] < 0) names_[v] = next_++;
  }

  void use(ValueId v) {
    if (v >= 0 && static_cast<size_t>(v) < names_.size() && names_[v] >= 0)
      out_ += "%" + std::to_string(names_[v]);
    else
      out_ += "%?" + std::to_string(v);
  }

  void type_of(ValueId v) {
    if (v >= 0 && static_cast<size_t>(v) < k_.values.size())
      out_ += k_.values[v].to_string();
    else
      out_ += "?";
  }

  void typed_def(ValueId v) {
    define(v);
    use(v);
    out_ += ": ";
    type_of(v);
  }

  void loc(const SourceLoc& l) {
    if (!opts_.locations || !l.known()) return;
    out_ += " loc(";
    append_quoted(out_, l.file);
    out_ += ":" + std::to_string(l.line) + ":" + std::to_string(l.column) + ")";
  }

  void ints(const Ints& v) {
    out_ += '[';
    for (size_t i = 0; i < v.size(); ++i) out_ += (i ? ", " : "") + std::to_string(v[i]);
    out_ += ']';
  }

  void index_start(const IndexEntry& e) {
    out_ += e.dynamic >= 0 ? "$" + std::to_string(e.dynamic) : std::to_string(e.start);
  }

  void attr_value(const AttrValue& v) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, int64_t>) {
            out_ += std::to_string(x);
          } else if constexpr (std::is_same_v<T, Ints>) {
            ints(x);
          } else if constexpr (std::is_same_v<T, DType>) {
            out_ += dtype_name(x);
          } else if constexpr (std::is_same_v<T, Scalar>) {
            out_ += scalar_text(x) + " : " + std::string(dtype_name(x.dtype));
          } else if constexpr (std::is_same_v<T, std::string>) {
            append_quoted(out_, x);
          } else {
            static_assert(std::is_same_v<T, Indexer>);
            out_ += '[';
            for (size_t i = 0; i < x.entries.size(); ++i) {
              const IndexEntry& e = x.entries[i];
              if (i) out_ += ", ";
              if (!e.is_slice) {
                index_start(e);
                continue;
              }
              out_ += "ds(";
              index_start(e);
              out_ += ", " + std::to_string(e.size);
              if (e.stride != 1) out_ += ", " + std::to_string(e.stride);
              out_ += ')';
            }
            out_ += ']';
          }
        },
        v);
  }

  void print_op(const Op& op, int indent) {
    out_.append(static_cast<size_t>(indent), ' ');
    // Results are named before the regions are printed: names follow the text order.
    for (size_t i = 0; i < op.results.size(); ++i) {
      if (i) out_ += ", ";
      define(op.results[i]);
      use(op.results[i]);
    }
    if (!op.results.empty()) out_ += " = ";
    out_ += op.info().name;
    out_ += '(';
    for (size_t i = 0; i < op.operands.size(); ++i) {
      if (i) out_ += ", ";
      use(op.operands[i]);
    }
    out_ += ')';
    if (!op.attrs.items().empty()) {
      out_ += " {";
      bool first = true;
      for (const auto& [key, value] : op.attrs.items()) {
        if (!first) out_ += ", ";
        first = false;
        out_ += attr_name(key);
        out_ += " = ";
        attr_value(value);
      }
      out_ += '}';
    }
    if (!op.regions.empty()) {
      out_ += " (";
      for (size_t r = 0; r < op.regions.size(); ++r) {
        const Region& region = op.regions[r];
        out_ += r ? ", {\n" : "{\n";
        out_.append(static_cast<size_t>(indent), ' ');
        out_ += "^(";
        for (size_t i = 0; i < region.args.size(); ++i) {
          if (i) out_ += ", ";
          typed_def(region.args[i]);
        }
        out_ += "):\n";
        for (const Op& inner : region.ops) print_op(inner, indent + 2);
        out_.append(static_cast<size_t>(indent), ' ');
        out_ += '}';
      }
      out_ += ')';
    }
    if (!op.results.empty()) {
      out_ += " : ";
      for (size_t i = 0; i < op.results.size(); ++i) {
        if (i) out_ += ", ";
        type_of(op.results[i]);
      }
    }
    loc(op.loc);
    out_ += '\n';
  }

  const Kernel& k_;
  const PrintOptions& opts_;
  std::vector<int> names_;  // ValueId -> printed number, -1 until defined in the text
  int next_ = 0;
  std::string out_;
};

}  // namespace

std::string print(const Kernel& k, const PrintOptions& opts) { return Printer(k, opts).run(); }

}  // namespace pallas::ir
