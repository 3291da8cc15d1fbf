// The IR text form, parsing side: a hand-written recursive descent over the characters that
// builds a Kernel directly and checks each op with its result-type rule as soon as the op is
// complete (so errors point into the text), then runs ir::verify on the whole kernel.
//
// Grammar (whitespace, including newlines, is free between tokens; "//" starts a comment):
//
//   kernel  := 'kernel' '@' (NAME | STRING) '(' [param {',' param}] ')' [loc] '{' {op} '}'
//   param   := VALUE ':' type
//   op      := [VALUE {',' VALUE} '='] OPNAME '(' [VALUE {',' VALUE}] ')'
//              [attrs] [regions] [':' type {',' type}] [loc]
//   attrs   := '{' [ATTRNAME '=' attrval {',' ATTRNAME '=' attrval}] '}'
//   regions := '(' region {',' region} ')'
//   region  := '{' '^' '(' [param {',' param}] ')' ':' {op} '}'
//   type    := DTYPE '[' [INT {',' INT}] ']'  |  'ref' '<' DTYPE '[' ... ']' ',' SPACE '>'
//   loc     := 'loc' '(' STRING ':' INT ':' INT ')'
//   VALUE   := '%' [A-Za-z0-9_.]+      (any spelling; the printer writes %0, %1, ...)
//   STRING  := JSON-style: '"' with escapes \" \\ \/ \n \t \r \b \f \uXXXX '"'
//
// Attribute values are read according to their key (kAttrKinds below), because the text of
// some kinds is ambiguous on its own ("[3, 4]" is an Ints, or an Indexer of two integer
// entries under the `index` key):
//   int:     -12              ints:  [1, 2]         dtype: f32         string: "text"
//   scalar:  1.5 : f32, -inf : f32, nan : f16, true : bool, 0x7fc00001 : f32 (bit pattern of
//            the dtype's width, or 16 hex digits: the Scalar's raw 64-bit storage)
//   indexer: [3, $1, ds(0, 8), ds($2, 8, 2)]  ($k: the op's operand number k)
//
// Value names are unique over the whole kernel. ValueIds are allocated in text order (results
// when the op's first line names them), which is the printer's numbering: printing a parsed
// kernel reproduces its text.
#include <bit>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "ir/builder.h"
#include "pallas/ir/ir.h"

#pragma GCC diagnostic error "-Wswitch"

namespace pallas::ir {

namespace {

enum class AttrKind { Int, Ints, DType, Scalar, String, Indexer };

// The kind of value each attribute key holds. A switch (with -Wswitch an error) so that a key
// added to PALLAS_ATTRS cannot be forgotten here.
AttrKind attr_kind(AttrKey k) {
  switch (k) {
    case AttrKey::Value: return AttrKind::Scalar;
    case AttrKey::DTypeAttr: return AttrKind::DType;
    case AttrKey::ShapeAttr:
    case AttrKey::Axes:
    case AttrKey::Dims:
    case AttrKey::Permutation:
    case AttrKey::Start:
    case AttrKey::Limit:
    case AttrKey::Strides:
    case AttrKey::Sizes:
    case AttrKey::LhsContracting:
    case AttrKey::RhsContracting:
    case AttrKey::LhsBatch:
    case AttrKey::RhsBatch:
    case AttrKey::Arrivals: return AttrKind::Ints;
    case AttrKey::Axis:
    case AttrKey::Exponent:
    case AttrKey::Rounding:
    case AttrKey::Reverse:
    case AttrKey::NumKeys:
    case AttrKey::Descending:
    case AttrKey::Parallel:
    case AttrKey::Unroll:
    case AttrKey::Reduce:
    case AttrKey::Masked:
    case AttrKey::HasCoreIndex:
    case AttrKey::CommitGroup:
    case AttrKey::Indirect:
    case AttrKey::AddAttr:
    case AttrKey::ReadOnly:
    case AttrKey::Decrement:
    case AttrKey::N: return AttrKind::Int;
    case AttrKey::Index: return AttrKind::Indexer;
    case AttrKey::Kind:
    case AttrKey::DeviceIdType:
    case AttrKey::AxisNames:
    case AttrKey::Name:
    case AttrKey::Format: return AttrKind::String;
  }
  return AttrKind::Int;
}

// Deeper nesting than this is certainly not a real kernel; the limit keeps the recursion (and
// the stack) bounded on hostile input.
constexpr int kMaxRegionDepth = 200;

bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return is_ident_char(c) || c == '.'; }

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Kernel run() {
    skip_ws();
    size_t at = p_;
    if (ident() != "kernel") fail_expected(at, "'kernel'");
    expect('@', "before the kernel name");
    skip_ws();
    if (peek_raw() == '"') {
      k_.name = string_literal();
    } else {
      std::string_view n = run_of(is_name_char);
      if (n.empty()) fail_expected(p_, "a kernel name after '@'");
      k_.name = std::string(n);
    }
    scopes_.emplace_back();
    expect('(', "after the kernel name");
    k_.body.args = params("kernel parameters");
    k_.loc = opt_loc();
    expect('{', "to open the kernel body");
    region_ops(k_.body, /*is_body=*/true);
    expect('}', "to close the kernel body");
    skip_ws();
    if (p_ < s_.size()) fail_expected(p_, "end of input after the kernel");
    verify(k_);
    return std::move(k_);
  }

 private:
  // ---- Errors ----------------------------------------------------------------------------
  [[noreturn]] void fail_at(size_t at, const std::string& msg) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw Error("parse error at " + std::to_string(line) + ":" + std::to_string(col) + ": " + msg);
  }

  // A short description of the token at `at`, for "got ..." in messages.
  std::string token_at(size_t at) const {
    if (at >= s_.size()) return "end of input";
    size_t end = at;
    if (s_[at] == '%' || s_[at] == '$') ++end;
    while (end < s_.size() && end - at < 24 && is_name_char(s_[end])) ++end;
    if (end == at || (end == at + 1 && !is_name_char(s_[at]))) end = at + 1;
    std::string out;
    for (size_t i = at; i < end; ++i) {
      unsigned char c = static_cast<unsigned char>(s_[i]);
      if (c < 0x20 || c >= 0x7f) {
        static constexpr char kHex[] = "0123456789abcdef";
        out += "\\x";
        out += kHex[c >> 4];
        out += kHex[c & 15];
      } else {
        out += static_cast<char>(c);
      }
    }
    return "'" + out + "'";
  }

  [[noreturn]] void fail_expected(size_t at, const std::string& what) const {
    fail_at(at, "expected " + what + ", got " + token_at(at));
  }

  // ---- Characters and tokens --------------------------------------------------------------
  void skip_ws() {
    while (p_ < s_.size()) {
      char c = s_[p_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++p_;
      } else if (c == '/' && p_ + 1 < s_.size() && s_[p_ + 1] == '/') {
        while (p_ < s_.size() && s_[p_] != '\n') ++p_;
      } else {
        break;
      }
    }
  }
  char peek_raw() const { return p_ < s_.size() ? s_[p_] : '\0'; }
  char peek() {
    skip_ws();
    return peek_raw();
  }
  bool accept(char c) {
    if (peek() != c) return false;
    ++p_;
    return true;
  }
  void expect(char c, const std::string& context) {
    if (accept(c)) return;
    fail_expected(p_, std::string("'") + c + "' " + context);
  }
  template <class Pred> std::string_view run_of(Pred pred) {
    size_t start = p_;
    while (p_ < s_.size() && pred(s_[p_])) ++p_;
    return s_.substr(start, p_ - start);
  }
  std::string_view ident() {
    skip_ws();
    if (!is_ident_start(peek_raw())) return {};
    return run_of(is_ident_char);
  }

  int64_t integer(const std::string& what) {
    skip_ws();
    size_t start = p_;
    if (peek_raw() == '-') ++p_;
    while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) ++p_;
    int64_t v = 0;
    auto r = std::from_chars(s_.data() + start, s_.data() + p_, v);
    if (r.ec == std::errc::result_out_of_range) fail_at(start, what + " is out of range");
    if (r.ec != std::errc() || r.ptr != s_.data() + p_) fail_expected(start, what);
    return v;
  }

  int int32(const std::string& what) {
    size_t start = p_;
    int64_t v = integer(what);
    if (v < INT32_MIN || v > INT32_MAX) fail_at(start, what + " is out of range");
    return static_cast<int>(v);
  }

  std::string string_literal() {
    skip_ws();
    size_t start = p_;
    if (peek_raw() != '"') fail_expected(p_, "a string");
    ++p_;
    std::string out;
    while (true) {
      if (p_ >= s_.size()) fail_at(start, "unterminated string");
      char c = s_[p_++];
      if (c == '"') return out;
      if (c == '\n') fail_at(p_ - 1, "newline inside a string (write \\n)");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= s_.size()) fail_at(start, "unterminated string");
      char e = s_[p_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          uint32_t cp = 0;
          for (int i = 0; i < 4; ++i) {
            char h = p_ < s_.size() ? s_[p_] : '\0';
            int d = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                    : (h >= 'a' && h <= 'f')                   ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F')                   ? h - 'A' + 10
                                                               : -1;
            if (d < 0) fail_expected(p_, "4 hex digits after \\u");
            cp = cp * 16 + static_cast<uint32_t>(d);
            ++p_;
          }
          // \u00XX below 0x80 is the byte itself (what the printer writes for control bytes);
          // larger code points are encoded as UTF-8, as JSON means them.
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xc0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          } else {
            out += static_cast<char>(0xe0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          }
          break;
        }
        default: fail_at(p_ - 2, "unknown escape '\\" + std::string(1, e) + "' in a string");
      }
    }
  }

  DType dtype() {
    skip_ws();
    size_t at = p_;
    std::string_view name = ident();
    if (name.empty()) fail_expected(at, "a dtype");
    try {
      return parse_dtype(name);
    } catch (const Error&) {
      fail_at(at, "unknown dtype '" + std::string(name) + "'");
    }
  }

  Type type() {
    skip_ws();
    size_t at = p_;
    std::string_view word = ident();
    if (word.empty()) fail_expected(at, "a type");
    Type t;
    bool is_ref = word == "ref";
    if (is_ref) {
      expect('<', "after 'ref'");
      t.dtype = dtype();
    } else {
      p_ = at;
      t.dtype = dtype();
    }
    t.is_ref = is_ref;
    expect('[', "to start the shape");
    if (!accept(']')) {
      do t.shape.push_back(integer("a dimension size"));
      while (accept(','));
      expect(']', "to end the shape");
    }
    if (is_ref) {
      expect(',', "before the memory space");
      skip_ws();
      size_t sat = p_;
      std::string_view space = ident();
      if (space.empty()) fail_expected(sat, "a memory space");
      try {
        t.space = parse_memory_space(space);
      } catch (const Error&) {
        fail_at(sat, "unknown memory space '" + std::string(space) + "'");
      }
      expect('>', "to close the ref type");
    }
    return t;
  }

  SourceLoc opt_loc() {
    skip_ws();
    size_t at = p_;
    if (ident() != "loc") {
      p_ = at;
      return {};
    }
    expect('(', "after 'loc'");
    SourceLoc l;
    l.file = string_literal();
    expect(':', "after the file name");
    l.line = int32("a line number");
    expect(':', "after the line number");
    l.column = int32("a column number");
    expect(')', "to close loc(...)");
    return l;
  }

  // ---- Values -------------------------------------------------------------------------------
  enum State : char { kPending, kVisible, kEnded };

  std::string value_name() {
    skip_ws();
    size_t at = p_;
    if (peek_raw() != '%') fail_expected(at, "a value (%name)");
    ++p_;
    std::string_view n = run_of(is_name_char);
    if (n.empty()) fail_expected(at, "a value (%name)");
    return "%" + std::string(n);
  }

  // Allocates the id of a newly named value (its type is filled in by the caller).
  ValueId declare(const std::string& name, size_t at, State state) {
    if (ids_.count(name)) fail_at(at, "redefinition of " + name);
    ValueId v = static_cast<ValueId>(k_.values.size());
    k_.values.emplace_back();
    state_.push_back(state);
    ids_.emplace(name, v);
    if (state == kVisible) scopes_.back().push_back(v);
    return v;
  }

  ValueId use() {
    skip_ws();
    size_t at = p_;
    std::string name = value_name();
    auto it = ids_.find(name);
    if (it == ids_.end()) fail_at(at, name + " is not defined");
    switch (state_[it->second]) {
      case kPending:
        fail_at(at, name + " is used before it is defined (an op's results are defined after "
                           "its regions)");
      case kEnded:
        fail_at(at, name + " is not visible here (it is defined in a region that has ended)");
      case kVisible: break;
    }
    return it->second;
  }

  // Comma-separated "%x: type" up to the closing ')' (consumed).
  std::vector<ValueId> params(const char* what) {
    std::vector<ValueId> out;
    if (accept(')')) return out;
    do {
      skip_ws();
      size_t at = p_;
      std::string name = value_name();
      expect(':', "after " + name);
      Type t = type();
      ValueId v = declare(name, at, kVisible);
      k_.values[v] = std::move(t);
      out.push_back(v);
    } while (accept(','));
    expect(')', std::string("after the ") + what);
    return out;
  }

  // ---- Attributes ---------------------------------------------------------------------------
  Ints int_list(const std::string& what) {
    Ints v;
    expect('[', "to start " + what);
    if (accept(']')) return v;
    do v.push_back(integer("an integer in " + what));
    while (accept(','));
    expect(']', "to end " + what);
    return v;
  }

  // An index start: an integer, or "$k" (operand k).
  void index_start(IndexEntry& e) {
    skip_ws();
    const size_t at = p_;
    if (accept('$')) {
      e.dynamic = int32("an operand number after '$'");
      if (e.dynamic < 0) fail_at(at, "an operand number cannot be negative");
    } else {
      e.start = integer("an index, '$k' or 'ds(...)'");
    }
  }

  Indexer indexer() {
    Indexer ix;
    expect('[', "to start the indexer");
    if (accept(']')) return ix;
    do {
      IndexEntry e;
      skip_ws();
      size_t at = p_;
      if (ident() == "ds") {
        e.is_slice = true;
        expect('(', "after 'ds'");
        index_start(e);
        expect(',', "after the slice start");
        e.size = integer("a slice size");
        if (accept(',')) e.stride = integer("a slice stride");
        expect(')', "to close ds(...)");
      } else {
        p_ = at;
        index_start(e);
      }
      ix.entries.push_back(e);
    } while (accept(','));
    expect(']', "to end the indexer");
    return ix;
  }

  Scalar scalar() {
    skip_ws();
    size_t at = p_;
    std::string_view text = run_of([](char c) {
      return is_ident_char(c) || c == '.' || c == '-' || c == '+';
    });
    if (text.empty()) fail_expected(at, "a scalar literal");
    expect(':', "and the dtype after the scalar " + std::string(text));
    DType t = dtype();
    if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X'))
      return scalar_bits(text.substr(2), t, at);
    try {
      return Scalar::parse(text, t);
    } catch (const Error& e) {
      fail_at(at, e.what());
    }
  }

  // The printer's hex form: the dtype's bit pattern, or the Scalar's 64-bit storage.
  Scalar scalar_bits(std::string_view digits, DType t, size_t at) {
    const int n = itemsize(t);
    uint64_t bits = 0;
    auto r = std::from_chars(digits.data(), digits.data() + digits.size(), bits, 16);
    if (r.ec != std::errc() || r.ptr != digits.data() + digits.size() ||
        (digits.size() != static_cast<size_t>(2 * n) && digits.size() != 16))
      fail_at(at, "a hex scalar of dtype " + std::string(dtype_name(t)) + " needs " +
                      std::to_string(2 * n) + " (or 16) hex digits");
    if (digits.size() == 16 && n != 8) {
      Scalar s;
      s.dtype = t;
      s.u = bits;
      return s;
    }
    unsigned char buf[8] = {};
    for (int i = 0; i < n; ++i) {
      const int byte = std::endian::native == std::endian::little ? i : n - 1 - i;
      buf[byte] = static_cast<unsigned char>(bits >> (8 * i));
    }
    return Scalar::load_from(buf, t);
  }

  Attrs attrs() {
    Attrs a;
    if (accept('}')) return a;
    do {
      skip_ws();
      size_t at = p_;
      std::string_view name = ident();
      if (name.empty()) fail_expected(at, "an attribute name");
      std::optional<AttrKey> key = attr_from_name(name);
      if (!key) fail_at(at, "unknown attribute '" + std::string(name) + "'");
      if (a.has(*key)) fail_at(at, "attribute '" + std::string(name) + "' is given twice");
      expect('=', "after the attribute name");
      skip_ws();
      switch (attr_kind(*key)) {
        case AttrKind::Int: a.set(*key, integer("an integer for '" + std::string(name) + "'")); break;
        case AttrKind::Ints: a.set(*key, int_list("the list '" + std::string(name) + "'")); break;
        case AttrKind::DType: a.set(*key, dtype()); break;
        case AttrKind::Scalar: a.set(*key, scalar()); break;
        case AttrKind::String: a.set(*key, string_literal()); break;
        case AttrKind::Indexer: a.set(*key, indexer()); break;
      }
    } while (accept(','));
    expect('}', "to close the attributes");
    return a;
  }

  // ---- Ops and regions ----------------------------------------------------------------------
  void region_ops(Region& r, bool is_body) {
    bool after_yield = false;
    while (peek() != '}') {
      size_t at = p_;
      if (at >= s_.size()) fail_expected(at, "an op or '}'");
      if (after_yield) fail_at(at, "yield must be the last op of its region");
      Op op = parse_op();
      if (op.code == OpCode::Yield) {
        if (is_body) fail_at(at, "the kernel body cannot yield");
        after_yield = true;
      }
      r.ops.push_back(std::move(op));
    }
  }

  Region region() {
    if (++depth_ > kMaxRegionDepth) fail_at(p_, "regions are nested too deeply");
    Region r;
    expect('{', "to open a region");
    expect('^', "to start the region's arguments");
    expect('(', "after '^'");
    scopes_.emplace_back();
    r.args = params("region arguments");
    expect(':', "after the region's arguments");
    region_ops(r, /*is_body=*/false);
    expect('}', "to close the region");
    for (ValueId v : scopes_.back()) state_[v] = kEnded;
    scopes_.pop_back();
    --depth_;
    return r;
  }

  Op parse_op() {
    skip_ws();
    const size_t op_at = p_;
    Op op;
    std::vector<std::string> result_names;
    if (peek_raw() == '%') {
      do {
        skip_ws();
        size_t at = p_;
        std::string name = value_name();
        op.results.push_back(declare(name, at, kPending));
        result_names.push_back(name);
      } while (accept(','));
      expect('=', "after the result names");
    }
    skip_ws();
    const size_t name_at = p_;
    std::string_view name = ident();
    if (name.empty()) fail_expected(name_at, "an op name");
    std::optional<OpCode> code = op_from_name(name);
    if (!code) fail_at(name_at, "unknown op '" + std::string(name) + "'");
    op.code = *code;
    expect('(', "after the op name");
    if (!accept(')')) {
      do op.operands.push_back(use());
      while (accept(','));
      expect(')', "after operands");
    }
    if (accept('{')) op.attrs = attrs();
    if (accept('(')) {
      do op.regions.push_back(region());
      while (accept(','));
      expect(')', "after the regions");
    }
    std::vector<Type> declared;
    skip_ws();
    const size_t types_at = p_;
    if (accept(':')) {
      if (op.results.empty()) fail_at(types_at, "result types given for an op without results");
      do declared.push_back(type());
      while (accept(','));
      if (declared.size() != op.results.size())
        fail_at(types_at, std::to_string(op.results.size()) + " results but " +
                              std::to_string(declared.size()) + " result types");
    } else if (!op.results.empty()) {
      fail_expected(types_at, "':' and the result types");
    }
    op.loc = opt_loc();
    check_op(op, declared, op_at);
    for (size_t i = 0; i < op.results.size(); ++i) {
      ValueId v = op.results[i];
      k_.values[v] = declared[i];
      state_[v] = kVisible;
      scopes_.back().push_back(v);
    }
    return op;
  }

  // Counts from the op table, then the op's result-type rule, with the error at the op's text.
  void check_op(const Op& op, const std::vector<Type>& declared, size_t at) {
    const OpInfo& info = op.info();
    std::string n(info.name);
    auto count = [&](int want, size_t got, const char* what) {
      if (want >= 0 && got != static_cast<size_t>(want))
        fail_at(at, n + ": expected " + std::to_string(want) + " " + what + ", got " +
                        std::to_string(got));
    };
    count(info.num_operands, op.operands.size(), "operands");
    count(info.num_results, op.results.size(), "results");
    count(info.num_regions, op.regions.size(), "regions");
    std::vector<Type> operand_types;
    for (ValueId v : op.operands) operand_types.push_back(k_.type(v));
    std::vector<RegionSignature> sigs;
    for (const Region& r : op.regions) sigs.push_back(region_signature(k_.values, r));
    std::vector<Type> expected;
    try {
      expected = infer_result_types(op.code, operand_types, op.attrs, sigs, op.loc);
    } catch (const Error& e) {
      fail_at(at, e.what());
    }
    if (expected.size() != declared.size())
      fail_at(at, n + ": " + std::to_string(declared.size()) + " results written, the op's rule gives " +
                      std::to_string(expected.size()));
    for (size_t i = 0; i < expected.size(); ++i)
      if (!(expected[i] == declared[i]))
        fail_at(at, n + ": result " + std::to_string(i) + " is written as " +
                        declared[i].to_string() + " but the op's rule gives " +
                        expected[i].to_string());
  }

  std::string_view s_;
  size_t p_ = 0;
  Kernel k_;
  std::unordered_map<std::string, ValueId> ids_;  // every name in the text (unique)
  std::vector<char> state_;                       // ValueId -> State
  std::vector<std::vector<ValueId>> scopes_;      // values defined in each open region
  int depth_ = 0;
};

}  // namespace

Kernel parse(std::string_view text) { return Parser(text).run(); }

}  // namespace pallas::ir
