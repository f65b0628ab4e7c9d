// The Jinja-subset interpreter on its own: each construct of the subset against what
// jinja2 renders in transformers' environment (trim_blocks, lstrip_blocks, loop controls,
// its tojson), the errors it names, and the bounds that keep a hostile template small.
#include "text/jinja.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace sg::jinja {
namespace {

absl::StatusOr<std::string> Render(absl::string_view text, const Dict& vars = Dict(),
                                   const Limits& limits = {}, const Environment& env = {}) {
  absl::StatusOr<Template> t = Template::Parse(text, limits);
  if (!t.ok()) return t.status();
  return t->Render(vars, env);
}

std::string Ok(absl::string_view text, const Dict& vars = Dict()) {
  absl::StatusOr<std::string> r = Render(text, vars);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status();
  return r.ok() ? *r : "<error>";
}

Dict Messages() {
  Dict user, answer;
  user.Set("role", Value("user"));
  user.Set("content", Value("  Hi  "));
  answer.Set("role", Value("assistant"));
  answer.Set("content", Value("Hello"));
  Dict vars;
  vars.Set("messages", Value(List{Value(user), Value(answer)}));
  return vars;
}

// Each expected text below is what jinja2 3.1 renders with
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).
TEST(Jinja, Whitespace) {
  EXPECT_EQ(Ok("a\n  {% if true %}\nx\n  {% endif %}\nb"), "a\nx\nb");
  EXPECT_EQ(Ok("a\n  {# c #}\nb"), "a\nb");
  EXPECT_EQ(Ok("a  {% if true %}x{% endif %}"), "a  x");
  EXPECT_EQ(Ok("  {{ 'v' }}\n"), "  v");  // one final newline dropped
  EXPECT_EQ(Ok("a\n {#- c -#} \n b"), "ab");
  EXPECT_EQ(Ok("a \n{{- 'b' -}}\n c"), "abc");
  EXPECT_EQ(Ok("a\r\nb"), "a\nb");
  EXPECT_EQ(Ok("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
  EXPECT_EQ(Ok("{% for i in range(3) %}\n  {{ i }}\n{% endfor %}"), "  0\n  1\n  2\n");
}

TEST(Jinja, Expressions) {
  EXPECT_EQ(Ok("{{ [1,'a',none,true,1.5, {'k': 2}] }}"), "[1, 'a', None, True, 1.5, {'k': 2}]");
  EXPECT_EQ(Ok("{{ 1/2 }} {{ 7//2 }} {{ -7//2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2**10 }}"),
            "0.5 3 -4 1 2 1024");
  EXPECT_EQ(Ok("{{ 'ab' * 3 }}{{ 1 + 2 * 3 }}{{ (1 + 2) * 3 }}"), "ababab79");
  EXPECT_EQ(Ok("{{ 1e20 }} {{ 0.1+0.2 }} {{ 1e-5 }} {{ 3.0 }} {{ 10 / 4 }}"),
            "1e+20 0.30000000000000004 1e-05 3.0 2.5");
  EXPECT_EQ(Ok("{{ 'a' ~ 1 ~ none }}|{{ [1, 2] ~ 'a' }}"), "a1None|[1, 2]a");
  EXPECT_EQ(Ok("{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' != 'b' }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}"),
            "TrueTrueTrueTrueFalse");
  EXPECT_EQ(Ok("{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [3] }}"),
            "TrueTrueTrueFalse");
  EXPECT_EQ(Ok("{{ 'a' in undefined_name }}"), "False");
  EXPECT_EQ(Ok("{{ not true or false }}{{ 0 and 1 }}{{ '' or 'x' }}"), "False0x");
  EXPECT_EQ(Ok("{{ 'y' if 1 > 2 else 'n' }}|{{ 'x' if false }}|"), "n||");
  EXPECT_EQ(
      Ok("{{ 'abcdef'[1:3] }}{{ 'abc'[::-1] }}{{ 'abc'[-1] }}{{ [1,2,3][1:] }}{{ [1,2,3][::-2] }}"),
      "bccbac[2, 3][3, 1]");
  EXPECT_EQ(Ok("{{ 'héllo'[1] }}{{ 'héllo'[:2] }}{{ 'héllo' | length }}"), "éhé5");
  EXPECT_EQ(Ok("{{ {'a': {'b': [5, 6]}}.a.b[1] }}{{ {'a': 1}['a'] }}{{ [1, 2].0 }}"), "611");
  EXPECT_EQ(Ok("{{ [1,2][5] }}|{{ {'a':1}['b'] }}|{{ x }}|"), "|||");
  EXPECT_EQ(Ok("{{ \"it's\" }}{{ 'a\\n\\tb\\u00e9' }}{{ 'a' 'b' }}"), "it'sa\n\tbéab");
}

TEST(Jinja, Statements) {
  EXPECT_EQ(
      Ok("{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}"
         "{{ loop.length }};{% endfor %}",
         Messages()),
      "01TrueFalse2;12FalseTrue2;");
  EXPECT_EQ(Ok("{% for x in [] %}a{% else %}e{% endfor %}{% for x in undefined_name %}a{% else "
               "%}u{% endfor %}"),
            "eu");
  EXPECT_EQ(Ok("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"),
            "2242");
  EXPECT_EQ(Ok("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"
               "{% for x in [1,2,3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "131");
  EXPECT_EQ(Ok("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }} {% endfor %}"),
            "a=1 b=2 ");
  // A set inside a loop lasts one pass; a namespace carries state out.
  EXPECT_EQ(Ok("{% set x = 5 %}{% for i in [1] %}{% set x = 3 %}{% endfor %}{{ x }}"), "5");
  EXPECT_EQ(Ok("{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}"), "[][]");
  EXPECT_EQ(Ok("{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
               "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(Ok("{% set ns = namespace() %}{% set ns.a = 'x' %}{{ ns.a }}"), "x");
  EXPECT_EQ(Ok("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(Ok("{% set block %}in {{ 1 + 1 }}{% endset %}[{{ block }}]"), "[in 2]");
  EXPECT_EQ(Ok("{% if false %}a{% elif 0 %}b{% elif 'x' %}c{% else %}d{% endif %}"), "c");
  EXPECT_EQ(Ok("{% macro m(a, b='z') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}{{ "
               "m(b=3, a=4) }}"),
            "<1z><12><43>");
  EXPECT_EQ(Ok("{% generation %}g{% endgeneration %}"), "g");
}

TEST(Jinja, FiltersTestsAndMethods) {
  EXPECT_EQ(
      Ok("{{ '  x ' | trim }}|{{ 'xaax'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|"),
      "x|aa|a | a|");
  EXPECT_EQ(Ok("{{ {'b': 1, 'a': [1, 'x', none, true]} | tojson }}{{ 'é<\"\\n' | tojson }}"),
            "{\"b\": 1, \"a\": [1, \"x\", null, true]}\"é<\\\"\\n\"");
  EXPECT_EQ(Ok("{{ {'b': 1, 'c': []} | tojson(indent=2) }}"), "{\n  \"b\": 1,\n  \"c\": []\n}");
  EXPECT_EQ(Ok("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(Ok("{{ 'hELLO wORLD' | capitalize }}|{{ 'hello world'.title() }}|{{ 'Ab' | upper }}{{ "
               "'Ab' | lower }}"),
            "Hello world|Hello World|ABab");
  EXPECT_EQ(Ok("{{ 'a-b-c' | replace('-', '+') }}{{ 'a-b-c'.replace('-', '', 1) }}"), "a+b+cab-c");
  EXPECT_EQ(
      Ok("{{ [1, 2, 3] | join(', ') }}|{{ [1, 2] | first }}{{ [1, 2] | last }}|{{ 'abc' | list }}"),
      "1, 2, 3|12|['a', 'b', 'c']");
  EXPECT_EQ(Ok("{{ x | default('d') }}{{ '' | default('e', true) }}{{ 'v' | default('f') }}"),
            "dev");
  EXPECT_EQ(Ok("{{ {'a': 1} | items | list }}{{ 5 | string }}{{ '42' | int + 1 }}{{ 'x' | int }}{{ "
               "'a' | safe }}"),
            "[['a', 1]]5430a");
  EXPECT_EQ(
      Ok("{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
         "{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join }}"
         "{{ messages | map(attribute='role') | map('upper') | join(',') }}",
         Messages()),
      "1HelloUSER,ASSISTANT");
  EXPECT_EQ(Ok("{{ none | selectattr('type') | list }}{{ none | map(attribute='x') | list }}"), "[][]");
  EXPECT_EQ(Ok("{{ 'a b  c'.split() }}{{ 'a,b'.split(',') }}{{ 'a</t>b'.split('</t>')[-1] }}"),
            "['a', 'b', 'c']['a', 'b']b");
  EXPECT_EQ(Ok("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'ABC'.lower() }}{{ "
               "'abc'.upper() }}"),
            "TrueTrueabcABC");
  EXPECT_EQ(Ok("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} "
               "is mapping }}"
               "{{ [] is iterable }}{{ 1 is iterable }}{{ 'u' is equalto 'u' }}{{ 3 is odd }}{{ 1 "
               "is not none }}"),
            "FalseTrueTrueTrueTrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(Ok("{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 2) }}{{ {'a': 1}.keys() | list }}"),
            "12['a']");
}

TEST(Jinja, Functions) {
  EXPECT_EQ(Ok("{{ range(3) | list }}{{ range(1, 7, 2) | join }}{{ range(3, 0, -1) | join }}"),
            "[0, 1, 2]135321");
  absl::StatusOr<std::string> raised =
      Render("line one\n{{ raise_exception('roles must alternate') }}");
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(raised.status().message(), "line 2")) << raised.status();
  EXPECT_TRUE(absl::StrContains(raised.status().message(), "roles must alternate"))
      << raised.status();
  Environment env;
  std::tm when{};
  when.tm_year = 2031 - 1900;
  when.tm_mon = 2;
  when.tm_mday = 3;
  env.now = when;
  absl::StatusOr<std::string> date =
      Render("{{ strftime_now('%d %b %Y') }}", Dict(), Limits(), env);
  ASSERT_TRUE(date.ok()) << date.status();
  EXPECT_EQ(*date, "03 Mar 2031");
}

// What Python would refuse is an error naming the line, never a guess.
TEST(Jinja, ErrorsNameWhatAndWhere) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"{{ 'a' + 1 }}", "'+' between a string and an int"},
      {"{{ x.y }}", "'x' is undefined"},
      {"{{ 1 // 0 }}", "division by zero"},
      {"{{ 9223372036854775807 + 1 }}", "integer overflow"},
      {"\n\n{% if x %}", "line 3"},
      {"{% for %}", "expected a name"},
      {"{{ x | frobnicate }}", "the filter 'frobnicate' is not supported"},
      {"{{ x is frobnicated }}", "the test 'frobnicated' is not supported"},
      {"{% include 'x' %}", "the statement 'include' is not supported"},
      {"{% endif %}", "unexpected {% endif %}"},
      {"{{ 'abc' }", "unclosed {{"},
      {"{{ [].append(1) }}", "has no method 'append'"},
      {"{% set x.y = 1 %}", "'x' is not a namespace"},
      {"{{ 'abc", "unclosed string literal"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<std::string> r = Render(text);
    ASSERT_FALSE(r.ok()) << text << " rendered " << *r;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(r.status().message(), want)) << text << ": " << r.status();
  }
}

// Every bound holds, with a message naming it: the template's size, the nesting of its
// syntax and of macro calls, the steps of work and the output's size.
TEST(Jinja, BoundsHold) {
  Limits small;
  small.max_template_bytes = 100;
  EXPECT_TRUE(absl::StrContains(Render(std::string(101, 'a'), Dict(), small).status().message(),
                                "at most 100"));
  EXPECT_TRUE(Render(std::string(100, 'a'), Dict(), small).ok());

  // Nesting in expressions, blocks and filter chains, far past the bound: refused while
  // parsing, without deep recursion.
  const int n = 100000;
  std::string parens = "{{ " + std::string(n, '(') + "1" + std::string(n, ')') + " }}";
  std::string nots = "{{ ";
  for (int i = 0; i < n; ++i) nots += "not ";
  nots += "1 }}";
  std::string filters = "{{ 'a'";
  for (int i = 0; i < n; ++i) filters += "|trim";
  filters += " }}";
  std::string ifs;
  for (int i = 0; i < n; ++i) ifs += "{% if 1 %}";
  std::string lists = "{{ " + std::string(n, '[') + std::string(n, ']') + " }}";
  for (const std::string* t : {&parens, &nots, &filters, &ifs, &lists}) {
    absl::StatusOr<std::string> r = Render(*t);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "nested more than")) << r.status();
  }
  // A long flat sum is no nesting.
  std::string sum = "{{ 0";
  for (int i = 0; i < 10000; ++i) sum += " + 1";
  EXPECT_EQ(Ok(sum + " }}"), "10000");

  // A macro calling itself.
  absl::StatusOr<std::string> rec =
      Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(rec.ok());
  EXPECT_TRUE(absl::StrContains(rec.status().message(), "macros calling themselves"))
      << rec.status();

  // Steps: loops that would run for ever, or doubling a string.
  Limits steps;
  steps.max_steps = 100000;
  absl::StatusOr<std::string> loops =
      Render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", Dict(),
             steps);
  ASSERT_FALSE(loops.ok());
  EXPECT_TRUE(absl::StrContains(loops.status().message(), "more than 100000 steps"))
      << loops.status();
  absl::StatusOr<std::string> doubling = Render(
      "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% "
      "endfor %}");
  ASSERT_FALSE(doubling.ok());
  EXPECT_TRUE(absl::StrContains(doubling.status().message(), "bytes")) << doubling.status();
  EXPECT_FALSE(Render("{{ 'x' * 1000000000 }}").ok());
  // An empty string or list repeated any number of times is empty, in no time (the fuzzer
  // found '' times 10^9 walking the count; 10^18 here would not end).
  absl::StatusOr<std::string> empty = Render(
      "{{ ('x' * 0 * 1000000000000000000) | length }},{{ ([] * 1000000000000000000) | length }}");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "0,0");
  EXPECT_FALSE(Render("{{ range(1000000000) | length }}").ok());

  // Values: nested without end, holding themselves, printed or compared at a size far
  // past the bounds (a list repeated holds references, not copies).
  absl::StatusOr<std::string> deep = Render(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor "
      "%}");
  ASSERT_FALSE(deep.ok());
  EXPECT_TRUE(absl::StrContains(deep.status().message(), "nested more than 128 deep"))
      << deep.status();
  for (const char* self : {"{% set ns = namespace() %}{% set ns.me = ns %}",
                           "{% set ns = namespace() %}{% set ns.l = [ns] %}",
                           "{% set ns = namespace() %}{% set ns.d = {'k': ns} %}",
                           "{% set ns = namespace() %}{% set ns.n = namespace(o=ns) %}"}) {
    absl::StatusOr<std::string> r = Render(self);
    ASSERT_FALSE(r.ok()) << self;
    EXPECT_TRUE(absl::StrContains(r.status().message(), "a namespace cannot be put")) << r.status();
  }
  absl::StatusOr<std::string> printed =
      Render("{% set a = range(200000) %}{{ [a, a, a, a, a, a, a, a, a, a] * 20000 }}");
  ASSERT_FALSE(printed.ok());
  EXPECT_TRUE(absl::StrContains(printed.status().message(), "bytes")) << printed.status();
  absl::StatusOr<std::string> json =
      Render("{% set a = range(200000) %}{{ ([a, a, a, a, a, a, a, a, a, a] * 20000) | tojson }}");
  ASSERT_FALSE(json.ok());
  EXPECT_TRUE(absl::StrContains(json.status().message(), "bytes")) << json.status();
  absl::StatusOr<std::string> compared =
      Render("{% set a = range(200000) %}{% set b = [a] * 200000 %}{{ b == b[:] }}{{ a in b }}");
  ASSERT_FALSE(compared.ok());
  EXPECT_TRUE(absl::StrContains(compared.status().message(), "steps")) << compared.status();

  // Output.
  Limits out;
  out.max_output_bytes = 1000;
  const std::string fifty(50, 'x');
  absl::StatusOr<std::string> big =
      Render("{% for i in range(21) %}" + fifty + "{% endfor %}", Dict(), out);
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(absl::StrContains(big.status().message(), "the output passes 1000 bytes"))
      << big.status();
  EXPECT_TRUE(Render("{% for i in range(20) %}" + fifty + "{% endfor %}", Dict(), out).ok());
  // A list is bounded as its bytes are.
  EXPECT_TRUE(
      absl::StrContains(Render("{{ range(1000) | length }}", Dict(), out).status().message(),
                        "range() of 1000 numbers"));
}

}  // namespace
}  // namespace sg::jinja
