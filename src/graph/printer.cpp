// The torch.fx-style graph listing.
#include <torchcap/printer.h>

#include "graph/python_literals.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace torchcap {
namespace detail {

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest digits that round-trip, then laid out as Python's repr() does:
  // positional notation for decimal exponents in [-4, 16), scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return negative ? "-" + out : out;
}

}  // namespace detail

namespace detail {

std::string python_string_literal(const std::string& s) {
  std::string out = "'";
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\'':
        out += "\\'";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char esc[8];
          std::snprintf(esc, sizeof(esc), "\\x%02x", c);
          out += esc;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "'";
}

const char* torch_dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexHalf: return "complex32";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::QInt8: return "qint8";
    case c10::ScalarType::QUInt8: return "quint8";
    case c10::ScalarType::QInt32: return "qint32";
    case c10::ScalarType::QUInt4x2: return "quint4x2";
    case c10::ScalarType::QUInt2x4: return "quint2x4";
    default: return nullptr;
  }
}

const char* torch_layout_name(c10::Layout l) {
  switch (l) {
    case c10::Layout::Strided: return "strided";
    case c10::Layout::Sparse: return "sparse_coo";
    case c10::Layout::SparseCsr: return "sparse_csr";
    case c10::Layout::SparseCsc: return "sparse_csc";
    case c10::Layout::SparseBsr: return "sparse_bsr";
    case c10::Layout::SparseBsc: return "sparse_bsc";
    case c10::Layout::Mkldnn: return "_mkldnn";
    default: return nullptr;
  }
}

const char* torch_memory_format_name(c10::MemoryFormat m) {
  switch (m) {
    case c10::MemoryFormat::Contiguous: return "contiguous_format";
    case c10::MemoryFormat::Preserve: return "preserve_format";
    case c10::MemoryFormat::ChannelsLast: return "channels_last";
    case c10::MemoryFormat::ChannelsLast3d: return "channels_last_3d";
    default: return nullptr;
  }
}

std::string python_device_literal(c10::Device d) {
  std::string s = "device(type=" + python_string_literal(c10::DeviceTypeName(d.type(), true));
  if (d.has_index()) s += ", index=" + std::to_string(d.index());
  return s + ")";
}

std::string python_literal(const Argument& a, const std::function<std::string(const Node*)>& node) {
  const auto& v = a.storage();
  switch (v.index()) {
    case 0:
      return "None";
    case 1:
      return node(a.to_node());
    case 2:
      return std::to_string(a.to_int());
    case 3: {
      double d = a.to_double();
      if (std::isnan(d)) return "float('nan')";
      if (std::isinf(d)) return d > 0 ? "float('inf')" : "float('-inf')";
      return detail::python_float_repr(d);
    }
    case 4:
      return a.to_bool() ? "True" : "False";
    case 5:
      return python_string_literal(a.to_string());
    case 6: {
      const char* n = torch_dtype_name(a.to_scalar_type());
      return n ? std::string("torch.") + n : std::string("<dtype ") + c10::toString(a.to_scalar_type()) + ">";
    }
    case 7: {
      const char* n = torch_layout_name(a.to_layout());
      return n ? std::string("torch.") + n : "<layout>";
    }
    case 8:
      return python_device_literal(a.to_device());
    case 9: {
      const char* n = torch_memory_format_name(a.to_memory_format());
      return n ? std::string("torch.") + n : "<memory_format>";
    }
    case 10: {
      std::string s = "[";
      const ArgumentList& l = a.to_list();
      for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + python_literal(l[i], node);
      return s + "]";
    }
  }
  return "?";
}

}  // namespace detail

std::string format_argument(const Argument& a) {
  return detail::python_literal(a, [](const Node* n) { return "%" + n->name(); });
}

std::string format_node(const Node& n) {
  std::ostringstream os;
  if (n.op() == OpCode::Output) {
    os << "return (";
    if (n.args().size() == 1 && n.args()[0].is_list()) {
      const ArgumentList& results = n.args()[0].to_list();
      for (size_t i = 0; i < results.size(); ++i) os << (i ? ", " : "") << format_argument(results[i]);
      if (results.size() == 1) os << ',';
    }
    os << ')';
    return os.str();
  }
  os << '%' << n.name() << " : ";
  std::string type = n.meta().val.str();
  if (!type.empty()) os << type << ' ';
  os << "[users=" << n.users().size() << "] = ";
  switch (n.op()) {
    case OpCode::Placeholder:
      os << "placeholder[target=" << n.target() << ']';
      return os.str();
    case OpCode::GetAttr:
      os << "get_attr[target=" << n.target() << ']';
      return os.str();
    default:
      break;
  }
  os << n.target() << '(';
  bool first = true;
  for (const Argument& a : n.args()) {
    os << (first ? "" : ", ") << format_argument(a);
    first = false;
  }
  for (const auto& kv : n.kwargs()) {
    os << (first ? "" : ", ") << kv.first << '=' << format_argument(kv.second);
    first = false;
  }
  os << ')';
  return os.str();
}

namespace {

// The source comment of `n` without "# ", or "" (see PrintOptions::source).
std::string format_source(const Node& n) {
  std::string out = n.meta().module_stack.innermost_str();
  const std::vector<SourceFrame>& frames = n.meta().stack_trace.frames();
  if (!frames.empty()) {
    const SourceFrame& f = frames.front();  // innermost: the line that called the operator
    if (!out.empty()) out += ", ";
    out += "File: " + f.file + ":" + std::to_string(f.line) +
           (f.function.empty() ? "" : " in " + f.function) + (f.code.empty() ? "" : ", code: " + f.code);
  }
  return out;
}

}  // namespace

std::string format_graph(const Graph& g, const PrintOptions& options) {
  std::string out = "graph():\n";
  for (const Node* n : g) {
    if (options.source && n->op() == OpCode::CallFunction) {
      std::string source = format_source(*n);
      if (!source.empty()) out += "    # " + source + "\n";
    }
    out += "    " + format_node(*n) + "\n";
  }
  return out;
}

}  // namespace torchcap
