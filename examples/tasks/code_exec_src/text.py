from common import PYTEST, d, finish, read, shell, step, task, write

# -- 008 word frequency ---------------------------------------------------------------------
STOPWORDS = d('''
    # common English words not worth counting
    the
    a
    an
    and
    of
    to

    in
    is
    it
''')
SPEECH = d('''
    The cat sat on the mat. The cat didn't mind; the MAT was warm, and it was 4 o'clock.
    A dog came in at 5 o'clock -- the dog's owner called: "Rex! Rex!" but Rex didn't come.
    Cats and dogs, dogs and cats: it's the oldest story in the book.
''')
task(
    "code-008-word-frequency",
    """Write wordfreq.py with a function top_words(text, n, stopwords=()) that returns the n most
    frequent words of text as a list of (word, count) tuples. Rules: a word is a maximal run of
    ASCII letters, optionally joined by single apostrophes inside it ("don't", "o'clock" and
    "rock'n'roll" are single words; an apostrophe at the start or end of a run is not part of the
    word, and two apostrophes in a row separate words); everything else, digits included,
    separates words. Words are compared and returned in lower case. Words in stopwords (compared
    case-insensitively) are not counted. Order by count, highest first, then alphabetically.
    Also make it a command: `python3 wordfreq.py FILE N` prints the top N words of FILE, one
    `word count` line each, ignoring the stop words listed in stopwords.txt in the current
    directory (one word per line; blank lines and lines starting with # are ignored; no
    stopwords.txt means no stop words). speech.txt and stopwords.txt are examples.""",
    setup_files={"stopwords.txt": STOPWORDS, "speech.txt": SPEECH},
    verifier_files={"test_wordfreq.py": d('''
        import shutil
        import subprocess
        import sys
        from pathlib import Path

        from wordfreq import top_words


        def test_counts_and_ties():
            assert top_words("the cat and the hat", 2) == [("the", 2), ("and", 1)]


        def test_apostrophes():
            text = "Don't stop. don't! 'quoted' rock'n'roll o'clock rock''roll"
            assert top_words(text, 10) == [("don't", 2), ("o'clock", 1), ("quoted", 1), ("rock", 1),
                                           ("rock'n'roll", 1), ("roll", 1), ("stop", 1)]


        def test_digits_and_punctuation_separate_words():
            assert top_words("abc123def abc_def; ABC", 5) == [("abc", 3), ("def", 2)]


        def test_stopwords_are_case_insensitive():
            assert top_words("The THE the end", 5, stopwords={"The"}) == [("end", 1)]


        def test_n_larger_than_the_vocabulary():
            assert top_words("b a b", 10) == [("b", 2), ("a", 1)]


        def test_command_on_the_example():
            out = subprocess.run([sys.executable, "wordfreq.py", "speech.txt", "4"], capture_output=True, text=True, check=True)
            assert out.stdout.splitlines() == ["rex 3", "cat 2", "cats 2", "didn't 2"]


        def test_command_elsewhere(tmp_path):
            shutil.copy("wordfreq.py", tmp_path / "wordfreq.py")
            (tmp_path / "in.txt").write_text("Zebra zebra yak; yak-yak? Xenon, the the\\n")
            no_stop = subprocess.run([sys.executable, "wordfreq.py", "in.txt", "2"], cwd=tmp_path,
                                     capture_output=True, text=True, check=True)
            assert no_stop.stdout == "yak 3\\nthe 2\\n"
            (tmp_path / "stopwords.txt").write_text("# none of these\\n\\nTHE\\nyak\\n")
            with_stop = subprocess.run([sys.executable, "wordfreq.py", "in.txt", "3"], cwd=tmp_path,
                                       capture_output=True, text=True, check=True)
            assert with_stop.stdout == "zebra 2\\nxenon 1\\n"
    ''')},
    command=f"{PYTEST} test_wordfreq.py",
    solution=[
        step("Look at the example files first.", read("speech.txt"), read("stopwords.txt")),
        step("A lower-cased regex of letter runs joined by single apostrophes does the tokenising; Counter plus a (-count, word) sort does the ranking.",
             write("wordfreq.py", d(r'''
                """Word frequencies: top_words(), and `python3 wordfreq.py FILE N`."""
                import re
                import sys
                from collections import Counter
                from pathlib import Path

                WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")


                def top_words(text, n, stopwords=()):
                    """The n most frequent words as (word, count), by count then alphabetically."""
                    stop = {word.lower() for word in stopwords}
                    counts = Counter(word for word in WORD.findall(text.lower()) if word not in stop)
                    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]


                def load_stopwords(path="stopwords.txt"):
                    path = Path(path)
                    if not path.exists():
                        return set()
                    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
                    return {line for line in lines if line and not line.startswith("#")}


                def main(argv):
                    if len(argv) != 2:
                        print("usage: python3 wordfreq.py FILE N", file=sys.stderr)
                        return 2
                    text = Path(argv[0]).read_text(encoding="utf-8")
                    for word, count in top_words(text, int(argv[1]), load_stopwords()):
                        print(word, count)
                    return 0


                if __name__ == "__main__":
                    sys.exit(main(sys.argv[1:]))
             '''))),
        step("Run it on the example and on the tricky apostrophe cases.",
             shell("python3 wordfreq.py speech.txt 6 && python3 -c \"from wordfreq import top_words; "
                   "print(top_words(\\\"Don't stop. don't! 'quoted' rock'n'roll rock''roll 4o'clock\\\", 10))\"")),
        step("Run the provided tests.", shell("python3 -m pytest -q test_wordfreq.py")),
        step("Counts look right: stop words gone, \"don't\" and \"o'clock\" kept whole, quotes stripped; the provided tests pass.",
             finish("wordfreq.py: top_words() with the apostrophe rules and stop words, plus the `python3 wordfreq.py FILE N` command reading stopwords.txt.")),
    ],
)

# -- 009 log parsing ------------------------------------------------------------------------
APP_LOG = d('''
    starting up (pid 4242)
    2024-05-01T12:00:01Z INFO [api] server started on :8080
    2024-05-01T12:00:05Z WARN [db] slow query took 1.2s
    2024-05-01T12:00:09Z ERROR [api] request failed: /orders/17
    Traceback (most recent call last):
      File "app.py", line 10, in handler
    ValueError: bad order id

    2024-05-01T12:01:00Z INFO [worker] job 42 done
    2024-05-01T12:01:30Z ERROR [db] connection lost
    2024-05-01T12:02:00Z DEBUG [api] cache hit ratio 0.93
    2024-05-01T12:03:10Z ERROR [api] request failed: /orders/18
      retrying in 5s
    2024-05-01T12:03:11Z INFO [api] retry ok
''')
task(
    "code-009-log-summary",
    """app.log is an application log. An entry starts with a line
    `TIMESTAMP LEVEL [COMPONENT] MESSAGE`, where TIMESTAMP looks like 2024-05-01T12:00:01Z and
    LEVEL is one of DEBUG, INFO, WARN, ERROR; every following non-blank line that does not start
    an entry is a detail line of the entry before it (a traceback, for instance). Blank lines and
    lines before the first entry are ignored. Write logstats.py with a function
    summarize_log(path) that returns a dict with exactly these keys: "entries" (number of
    entries), "levels" (level -> number of entries, only levels that occur), "errors_by_component"
    (component -> number of ERROR entries), "errors" (the ERROR entries in file order, each a dict
    {"timestamp", "component", "message", "details"} where details is the list of its detail lines
    with trailing whitespace removed) and "first_error" (timestamp of the first ERROR entry, or
    None).""",
    setup_files={"app.log": APP_LOG},
    verifier_files={"test_logstats.py": d('''
        from logstats import summarize_log


        def test_counts():
            summary = summarize_log("app.log")
            assert summary["entries"] == 8
            assert summary["levels"] == {"INFO": 3, "WARN": 1, "ERROR": 3, "DEBUG": 1}
            assert summary["errors_by_component"] == {"api": 2, "db": 1}
            assert summary["first_error"] == "2024-05-01T12:00:09Z"


        def test_errors_with_details():
            errors = summarize_log("app.log")["errors"]
            assert errors == [
                {"timestamp": "2024-05-01T12:00:09Z", "component": "api", "message": "request failed: /orders/17",
                 "details": ["Traceback (most recent call last):", '  File "app.py", line 10, in handler',
                             "ValueError: bad order id"]},
                {"timestamp": "2024-05-01T12:01:30Z", "component": "db", "message": "connection lost", "details": []},
                {"timestamp": "2024-05-01T12:03:10Z", "component": "api", "message": "request failed: /orders/18",
                 "details": ["  retrying in 5s"]},
            ]


        def test_exact_keys():
            assert set(summarize_log("app.log")) == {"entries", "levels", "errors_by_component", "errors", "first_error"}


        def test_no_errors(tmp_path):
            log = tmp_path / "quiet.log"
            log.write_text("2024-01-01T00:00:00Z INFO [x] hello\\n  more\\n\\n2024-01-01T00:00:01Z DEBUG [y] [bracketed] text\\n")
            assert summarize_log(str(log)) == {"entries": 2, "levels": {"INFO": 1, "DEBUG": 1},
                                               "errors_by_component": {}, "errors": [], "first_error": None}


        def test_empty_file(tmp_path):
            log = tmp_path / "empty.log"
            log.write_text("")
            assert summarize_log(str(log)) == {"entries": 0, "levels": {}, "errors_by_component": {},
                                               "errors": [], "first_error": None}


        def test_lookalike_lines_are_details(tmp_path):
            log = tmp_path / "odd.log"
            log.write_text("2024-01-01T00:00:00Z ERROR [core] boom\\n2024-01-01 00:00:01 INFO [core] not an entry\\n"
                           "2024-01-01T00:00:02Z NOTICE [core] nor this\\n")
            summary = summarize_log(str(log))
            assert summary["entries"] == 1
            assert summary["errors"][0]["details"] == ["2024-01-01 00:00:01 INFO [core] not an entry",
                                                       "2024-01-01T00:00:02Z NOTICE [core] nor this"]
    ''')},
    command=f"{PYTEST} test_logstats.py",
    solution=[
        step("Look at the log format.", shell("cat -A app.log | head -20")),
        step("One regex for entry lines; anything else non-blank after the first entry is a detail line of the current entry.",
             write("logstats.py", d(r'''
                import re
                from collections import Counter

                ENTRY = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) (DEBUG|INFO|WARN|ERROR) \[([^\]]+)\] (.*)$")


                def summarize_log(path):
                    """Entry, level and error counts of a log file, with each ERROR entry's detail lines."""
                    entries = []
                    with open(path, encoding="utf-8") as fh:
                        for raw in fh:
                            line = raw.rstrip()
                            if not line:
                                continue
                            match = ENTRY.match(line)
                            if match:
                                timestamp, level, component, message = match.groups()
                                entries.append({"timestamp": timestamp, "level": level, "component": component,
                                                "message": message, "details": []})
                            elif entries:
                                entries[-1]["details"].append(line)
                    errors = [
                        {key: entry[key] for key in ("timestamp", "component", "message", "details")}
                        for entry in entries
                        if entry["level"] == "ERROR"
                    ]
                    return {
                        "entries": len(entries),
                        "levels": dict(Counter(entry["level"] for entry in entries)),
                        "errors_by_component": dict(Counter(error["component"] for error in errors)),
                        "errors": errors,
                        "first_error": errors[0]["timestamp"] if errors else None,
                    }
             '''))),
        step("Print the summary of app.log.",
             shell("python3 -c \"import json; from logstats import summarize_log; print(json.dumps(summarize_log('app.log'), indent=2))\"")),
        step("Run the tests that came with the task.", shell("python3 -m pytest -q test_logstats.py")),
        step("8 entries, 3 errors, the traceback attached to the first error and the preamble line ignored; the provided tests pass.",
             finish("logstats.py: summarize_log() groups detail lines under their entry and reports entries, levels, errors by component, the ERROR entries and the first error time.")),
    ],
)

# -- 010 template rendering -----------------------------------------------------------------
task(
    "code-010-template-rendering",
    """Write template.py with render(template, context), a tiny template language. `{{ name }}`
    is replaced by str() of context["name"]; whitespace inside the braces is optional ({{name}}
    works too). Dotted names look into nested dicts: {{ user.name }} is
    context["user"]["name"]. A name may be followed by filters, each introduced by | (spaces around it are
    allowed), applied left to right: upper, lower, title, and default:"TEXT" which uses TEXT when the value is missing or
    None (TEXT contains no double quote or |). For example {{ nick|default:"anon"|upper }} gives
    ANON when nick is missing. A missing value that reaches the end (or another filter) without a
    default raises KeyError whose message contains the full dotted name; an unknown filter raises
    ValueError. Text outside tags is copied unchanged.""",
    verifier_files={"test_template.py": d('''
        import pytest

        from template import render


        def test_substitution_and_spacing():
            assert render("Hi {{ name }}, {{name}}!{{  name  }}", {"name": "Ana"}) == "Hi Ana, Ana!Ana"


        def test_non_string_values():
            assert render("{{ n }} items at {{ price }}", {"n": 3, "price": 2.5}) == "3 items at 2.5"


        def test_dotted_lookup():
            context = {"user": {"name": "ben", "address": {"city": "Oslo"}}}
            assert render("{{ user.name }} lives in {{ user.address.city }}", context) == "ben lives in Oslo"


        def test_filters_chain_left_to_right():
            context = {"title": "the grand BUDAPEST hotel"}
            assert render("{{ title|title }}|{{ title | upper }}|{{ title|upper|lower }}", context) == \\
                "The Grand Budapest Hotel|THE GRAND BUDAPEST HOTEL|the grand budapest hotel"


        def test_default():
            assert render('{{ nick|default:"anon" }}', {}) == "anon"
            assert render('{{ nick|default:"anon"|upper }}', {"nick": None}) == "ANON"
            assert render('{{ nick|default:"anon" }}', {"nick": "zed"}) == "zed"
            assert render('{{ user.nick|default:"n/a" }}', {"user": {}}) == "n/a"


        def test_missing_value_raises_key_error():
            with pytest.raises(KeyError) as excinfo:
                render("Mail {{ user.email }}", {"user": {"name": "x"}})
            assert "user.email" in str(excinfo.value)


        def test_unknown_filter_raises_value_error():
            with pytest.raises(ValueError):
                render("{{ name|reverse }}", {"name": "x"})


        def test_text_is_copied_unchanged():
            template = "Line 1: {{ a }}\\n  indented {b} { c } $d\\n{{ b }}"
            assert render(template, {"a": 1, "b": 2}) == "Line 1: 1\\n  indented {b} { c } $d\\n2"
    ''')},
    command=f"{PYTEST} test_template.py",
    solution=[
        step("re.sub with a callback per tag: resolve the dotted name (or a MISSING marker), then run the filters in order.",
             write("template.py", d(r'''
                import re

                TAG = re.compile(r"\{\{\s*(.*?)\s*\}\}")
                DEFAULT = re.compile(r'default:"([^"|]*)"')
                MISSING = object()
                FILTERS = {"upper": str.upper, "lower": str.lower, "title": str.title}


                def _lookup(context, dotted):
                    value = context
                    for part in dotted.split("."):
                        if not isinstance(value, dict) or part not in value:
                            return MISSING
                        value = value[part]
                    return value


                def _render_tag(expression, context):
                    name, *filters = [part.strip() for part in expression.split("|")]
                    value = _lookup(context, name)
                    for spec in filters:
                        default = DEFAULT.fullmatch(spec)
                        if default:
                            if value is MISSING or value is None:
                                value = default.group(1)
                            continue
                        if spec not in FILTERS:
                            raise ValueError(f"unknown filter {spec!r}")
                        if value is MISSING:
                            raise KeyError(name)
                        value = FILTERS[spec](str(value))
                    if value is MISSING:
                        raise KeyError(name)
                    return str(value)


                def render(template, context):
                    """Replace every {{ name|filter... }} tag with its value from context."""
                    return TAG.sub(lambda match: _render_tag(match.group(1), context), template)
             '''))),
        step("Try the spec's examples, including the error cases.",
             shell("python3 - <<'EOF'\nfrom template import render\n"
                   "print(render('Hi {{ user.name|title }} ({{ nick|default:\"anon\"|upper }})', {'user': {'name': 'ana lee'}}))\n"
                   "for tpl in ['{{ user.email }}', '{{ x|reverse }}']:\n"
                   "    try:\n        render(tpl, {'user': {}, 'x': 1})\n"
                   "    except (KeyError, ValueError) as exc:\n        print(type(exc).__name__, exc)\nEOF")),
        step("Now the provided tests.", shell("python3 -m pytest -q test_template.py")),
        step("Prints 'Hi Ana Lee (ANON)', a KeyError naming user.email and a ValueError for the unknown filter; the provided tests pass.",
             finish("template.py: render() with dotted lookups, upper/lower/title/default filters, KeyError for missing values and ValueError for unknown filters.")),
    ],
)

# -- 011 slugify ----------------------------------------------------------------------------
task(
    "code-011-slugify",
    """Write slug.py with slugify(text, max_length=50) and unique_slug(text, taken, max_length=50).
    slugify: replace accented Latin letters by their base letter (é -> e, Ü -> U), lower-case,
    replace every run of characters other than a-z and 0-9 (other letters such as ß included) by
    a single hyphen and strip leading
    and trailing hyphens; if the result is longer than max_length, cut it to max_length and strip
    trailing hyphens again. An empty result becomes "n-a". unique_slug returns slugify(text,
    max_length) if that is not in the set taken; otherwise the first of SLUG-2, SLUG-3, ... that
    is not in taken, where the base slug is cut (and trailing hyphens stripped) so that the whole
    result fits in max_length. unique_slug does not modify taken.""",
    verifier_files={"test_slug.py": d('''
        from slug import slugify, unique_slug


        def test_basic():
            assert slugify("Hello, World!") == "hello-world"


        def test_accents():
            assert slugify("Crème Brûlée à la carte") == "creme-brulee-a-la-carte"
            assert slugify("Über Straße") == "uber-stra-e"


        def test_symbols_and_underscores():
            assert slugify("  __snake_case__ & C++ ") == "snake-case-c"
            assert slugify("2024: the year") == "2024-the-year"


        def test_truncation():
            assert slugify("The quick brown fox jumps over the lazy dog", max_length=20) == "the-quick-brown-fox"
            assert len(slugify("x" * 80)) == 50


        def test_empty_result():
            assert slugify("!!!") == "n-a"
            assert slugify("") == "n-a"


        def test_unique_slug():
            assert unique_slug("Hello World", set()) == "hello-world"
            assert unique_slug("Hello World", {"hello-world", "hello-world-2"}) == "hello-world-3"


        def test_unique_slug_respects_max_length():
            assert unique_slug("abcdefghij", {"abcdefghij"}, max_length=10) == "abcdefgh-2"
            assert unique_slug("abc defghi", {"abc-de"}, max_length=6) == "abc-2"


        def test_unique_slug_leaves_taken_alone():
            taken = {"a"}
            unique_slug("A", taken)
            assert taken == {"a"}
    ''')},
    command=f"{PYTEST} test_slug.py",
    solution=[
        step("NFKD normalisation then dropping the combining marks handles the accents; the rest is one regex and careful truncation.",
             write("slug.py", d(r'''
                import re
                import unicodedata

                NON_ALNUM = re.compile(r"[^a-z0-9]+")


                def slugify(text, max_length=50):
                    """ASCII, lower-case, hyphen-separated, at most max_length characters; "n-a" if empty."""
                    # Decompose, then drop only the combining accents: ß and the like must become hyphens.
                    decomposed = unicodedata.normalize("NFKD", text)
                    base = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
                    slug = NON_ALNUM.sub("-", base.lower()).strip("-")
                    slug = slug[:max_length].rstrip("-")
                    return slug or "n-a"


                def unique_slug(text, taken, max_length=50):
                    """slugify(text), or the first SLUG-N (N >= 2) not in taken, within max_length."""
                    slug = slugify(text, max_length)
                    if slug not in taken:
                        return slug
                    n = 2
                    while True:
                        suffix = f"-{n}"
                        candidate = slug[: max_length - len(suffix)].rstrip("-") + suffix
                        if candidate not in taken:
                            return candidate
                        n += 1
             '''))),
        step("Spot-check accents, truncation and the unique suffix at the length limit.",
             shell("python3 -c \"from slug import slugify, unique_slug; print(slugify('Crème Brûlée à la carte'), "
                   "slugify('The quick brown fox jumps over the lazy dog', max_length=20), slugify('!!!'), "
                   "unique_slug('Hello World', {'hello-world', 'hello-world-2'}), unique_slug('abc defghi', {'abc-de'}, max_length=6))\"")),
        step("Run the provided tests.", shell("python3 -m pytest -q test_slug.py")),
        step("creme-brulee-a-la-carte the-quick-brown-fox n-a hello-world-3 abc-2: all as specified; the provided tests pass.",
             finish("slug.py: slugify() (accents folded, hyphenated, truncated, n-a when empty) and unique_slug() with -N suffixes that respect max_length.")),
    ],
)

# -- 012 INI config parser ------------------------------------------------------------------
task(
    "code-012-ini-config-parser",
    """Write confparse.py with parse_config(text) that parses INI-style text into a dict mapping
    section names to dicts of keys and values. Rules: `[name]` starts a section (name stripped);
    `key = value` or `key: value` (split at the first = or :) sets a key in the current section,
    with the key stripped and lower-cased and the value stripped; keys before any section go to
    the section "default". Blank lines and lines whose first non-space character is # or ; are
    ignored. A value in double quotes has the quotes removed and keeps its inner text verbatim
    and as a string; otherwise, an inline comment starting with " #" is cut off, then true/false
    (any case) become booleans and optionally negative integers (like 42 or -7) become ints;
    anything else stays a string. A repeated key keeps the last value; a repeated section is
    merged into the first. Any other line raises ValueError whose message contains "line N"
    (1-based).""",
    verifier_files={"test_confparse.py": d('''
        import pytest

        from confparse import parse_config

        TEXT = """\\
        name = demo
        ; top comment

        [server]
        host = 0.0.0.0   # all interfaces
        Port: 8080
        debug = TRUE
        motto = "keep # this ; too "
        ratio = 0.75
        offset = -7

          # indented comment
        [ database ]
        url = postgres://db:5432/app
        [server]
        port = 9090
        """


        def test_sections_and_types():
            assert parse_config(TEXT) == {
                "default": {"name": "demo"},
                "server": {"host": "0.0.0.0", "port": 9090, "debug": True, "motto": "keep # this ; too ",
                           "ratio": "0.75", "offset": -7},
                "database": {"url": "postgres://db:5432/app"},
            }


        def test_split_at_the_first_separator():
            assert parse_config("[a]\\nurl = http://x:1/?q=2\\nk: v=w\\n") == {"a": {"url": "http://x:1/?q=2", "k": "v=w"}}


        def test_quoted_values_stay_strings():
            assert parse_config('[a]\\nflag = "true"\\nn = "12"\\nempty = ""\\n') == {"a": {"flag": "true", "n": "12", "empty": ""}}


        def test_booleans_any_case():
            assert parse_config("x = False\\ny = tRuE\\n") == {"default": {"x": False, "y": True}}


        def test_invalid_line_reports_its_number():
            with pytest.raises(ValueError, match="line 3"):
                parse_config("[a]\\nk = v\\nthis is not valid\\n")


        def test_empty_text():
            assert parse_config("") == {}
    ''')},
    command=f"{PYTEST} test_confparse.py",
    solution=[
        step("A line-by-line parser: section headers, comments, then key/value split at the earliest = or :, then the value rules in the order the spec gives.",
             write("confparse.py", d(r'''
                import re

                SECTION = re.compile(r"^\s*\[([^\]]*)\]\s*$")
                INTEGER = re.compile(r"^-?\d+$")


                def _value(raw):
                    raw = raw.strip()
                    if len(raw) >= 2 and raw.startswith('"') and raw.endswith('"'):
                        return raw[1:-1]
                    cut = raw.find(" #")
                    if cut != -1:
                        raw = raw[:cut].rstrip()
                    if raw.lower() in ("true", "false"):
                        return raw.lower() == "true"
                    if INTEGER.match(raw):
                        return int(raw)
                    return raw


                def parse_config(text):
                    """INI text -> {section: {key: value}}; ValueError naming the line of anything unparsable."""
                    config = {}
                    section = "default"
                    for number, line in enumerate(text.splitlines(), 1):
                        stripped = line.strip()
                        if not stripped or stripped[0] in "#;":
                            continue
                        header = SECTION.match(line)
                        if header:
                            section = header.group(1).strip()
                            config.setdefault(section, {})
                            continue
                        positions = [i for i in (line.find("="), line.find(":")) if i != -1]
                        if not positions or not line[: min(positions)].strip():
                            raise ValueError(f"line {number}: expected [section], key = value or a comment: {line!r}")
                        split = min(positions)
                        key = line[:split].strip().lower()
                        config.setdefault(section, {})[key] = _value(line[split + 1:])
                    return config
             '''))),
        step("Check a sample with quotes, inline comments, a repeated section and a bad line.",
             write("sample.ini", 'name = demo\n[server]\nhost = 0.0.0.0  # all\nPort: 8080\nmotto = "a # b"\n[db]\nurl = postgres://db:5432/x\n[server]\nport = 9090\n'),
             shell("python3 -c \"import pprint; from confparse import parse_config; pprint.pprint(parse_config(open('sample.ini').read()))\"; "
                   "python3 -c \"from confparse import parse_config; parse_config('[a]\\nk = v\\nbroken\\n')\" 2>&1 | tail -1")),
        step("Run the provided tests too.", shell("python3 -m pytest -q test_confparse.py")),
        step("Sections merge, types convert, quotes are kept verbatim and the bad line is reported as line 3; the provided tests pass.",
             finish("confparse.py: parse_config() with sections, comments, quoted values, bool/int conversion and ValueError('line N: ...') for bad lines.")),
    ],
)
