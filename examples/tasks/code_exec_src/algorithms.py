from common import PYTEST, d, finish, read, shell, step, task, write

# -- 001 interval merging -------------------------------------------------------------------
task(
    "code-001-merge-intervals",
    """Write intervals.py with a function merge_intervals(intervals). intervals is a list of
    (start, end) integer pairs (tuples or two-item lists, start <= end, in any order). Return a
    new list of (start, end) tuples in which all overlapping or touching intervals are merged
    ((1, 3) and (3, 5) become (1, 5)), sorted by start. An empty list gives []. The input list
    must not be modified.""",
    verifier_files={"test_intervals.py": d('''
        from intervals import merge_intervals


        def test_overlapping_intervals_merge():
            assert merge_intervals([(1, 3), (2, 6), (8, 10), (15, 18)]) == [(1, 6), (8, 10), (15, 18)]


        def test_touching_intervals_merge():
            assert merge_intervals([(1, 3), (3, 5)]) == [(1, 5)]


        def test_unsorted_and_nested_input():
            assert merge_intervals([(5, 7), (1, 10), (2, 3), (12, 12)]) == [(1, 10), (12, 12)]


        def test_empty_input():
            assert merge_intervals([]) == []


        def test_lists_in_tuples_out():
            assert merge_intervals([[4, 5], [1, 2]]) == [(1, 2), (4, 5)]


        def test_input_is_not_modified():
            data = [(3, 4), (1, 2), (2, 3)]
            assert merge_intervals(data) == [(1, 4)]
            assert data == [(3, 4), (1, 2), (2, 3)]
    ''')},
    command=f"{PYTEST} test_intervals.py",
    solution=[
        step("Check what is in the workspace first.", shell("ls -la")),
        step("Sort a copy by start, then extend the last merged interval while the next one starts inside or right at its end.",
             write("intervals.py", d('''
                def merge_intervals(intervals):
                    """Merge overlapping or touching (start, end) intervals; a new list sorted by start."""
                    merged = []
                    for start, end in sorted(tuple(pair) for pair in intervals):
                        if merged and start <= merged[-1][1]:
                            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
                        else:
                            merged.append((start, end))
                    return merged
             '''))),
        step("Try the edge cases, then the provided tests.",
             shell("python3 -c \"from intervals import merge_intervals as m; d=[(5, 7), (1, 10), (2, 3), (12, 12)]; "
                   "print(m(d), d); print(m([(1, 3), (3, 5)]), m([]))\" && python3 -m pytest -q test_intervals.py")),
        step("Edge cases behave and all tests pass.", finish("intervals.py: merge_intervals sorts a copy and merges overlapping or touching intervals into tuples.")),
    ],
)

# -- 002 LRU cache --------------------------------------------------------------------------
task(
    "code-002-lru-cache",
    """Write lru.py with a class LRUCache(capacity), a least-recently-used cache.
    get(key, default=None) returns the key's value and marks the key as most recently used, or
    returns default if the key is absent. put(key, value) inserts or updates a key and marks it
    most recently used; when the cache then holds more than capacity keys, the least recently
    used key is evicted. len(cache) is the number of keys held, and `key in cache` tests
    membership without changing the usage order. capacity must be a positive integer; otherwise
    the constructor raises ValueError.""",
    verifier_files={"test_lru.py": d('''
        import pytest

        from lru import LRUCache


        def test_get_and_put():
            cache = LRUCache(2)
            cache.put("a", 1)
            assert cache.get("a") == 1
            assert cache.get("missing") is None
            assert cache.get("missing", 0) == 0


        def test_least_recently_used_is_evicted():
            cache = LRUCache(2)
            cache.put("a", 1)
            cache.put("b", 2)
            cache.get("a")
            cache.put("c", 3)
            assert "b" not in cache
            assert cache.get("a") == 1 and cache.get("c") == 3
            assert len(cache) == 2


        def test_update_refreshes_the_key():
            cache = LRUCache(2)
            cache.put("a", 1)
            cache.put("b", 2)
            cache.put("a", 10)
            cache.put("c", 3)
            assert "b" not in cache
            assert cache.get("a") == 10
            assert len(cache) == 2


        def test_membership_does_not_refresh():
            cache = LRUCache(2)
            cache.put("a", 1)
            cache.put("b", 2)
            assert "a" in cache
            cache.put("c", 3)
            assert "a" not in cache and "b" in cache


        def test_capacity_one():
            cache = LRUCache(1)
            cache.put("a", 1)
            cache.put("b", 2)
            assert len(cache) == 1 and cache.get("b") == 2 and cache.get("a") is None


        @pytest.mark.parametrize("capacity", [0, -3])
        def test_capacity_must_be_positive(capacity):
            with pytest.raises(ValueError):
                LRUCache(capacity)
    ''')},
    command=f"{PYTEST} test_lru.py",
    solution=[
        step("The provided tests pin down the eviction rules; read them first.", read("test_lru.py")),
        step("An OrderedDict keeps usage order: move_to_end on access, popitem(last=False) to evict.",
             write("lru.py", d('''
                from collections import OrderedDict


                class LRUCache:
                    """A mapping of at most `capacity` keys that evicts the least recently used one."""

                    def __init__(self, capacity):
                        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
                            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
                        self.capacity = capacity
                        self._data = OrderedDict()

                    def get(self, key, default=None):
                        if key not in self._data:
                            return default
                        self._data.move_to_end(key)
                        return self._data[key]

                    def put(self, key, value):
                        self._data[key] = value
                        self._data.move_to_end(key)
                        if len(self._data) > self.capacity:
                            self._data.popitem(last=False)

                    def __len__(self):
                        return len(self._data)

                    def __contains__(self, key):
                        return key in self._data
             '''))),
        step("Run the provided tests.", shell("python3 -m pytest -q test_lru.py")),
        step("All pass.", finish("lru.py: LRUCache built on OrderedDict (get/put/len/in, ValueError for a non-positive capacity).")),
    ],
)

# -- 003 topological sort -------------------------------------------------------------------
task(
    "code-003-topo-sort",
    """Write toposort.py with an exception class CycleError (a subclass of ValueError) and a
    function topo_sort(deps). deps is a dict mapping each node (a string) to the list of nodes it
    depends on; a dependency may be listed more than once, and nodes that appear only as
    dependencies are nodes too. Return a list of all nodes in which every node comes after all
    of its dependencies. Whenever several nodes are ready, take the alphabetically smallest
    first, so the result is unique. If the dependencies contain a cycle, raise CycleError with a
    message that names the nodes on the cycle.""",
    verifier_files={"test_toposort.py": d('''
        import pytest

        from toposort import CycleError, topo_sort


        def test_chain():
            assert topo_sort({"deploy": ["test"], "test": ["build"], "build": []}) == ["build", "test", "deploy"]


        def test_ties_are_broken_alphabetically():
            assert topo_sort({"b": [], "a": [], "c": ["a"]}) == ["a", "b", "c"]
            assert topo_sort({"z": [], "y": ["z"], "a": ["y"], "m": []}) == ["m", "z", "y", "a"]


        def test_nodes_that_are_only_dependencies():
            assert topo_sort({"app": ["lib", "utils"], "lib": ["utils"]}) == ["utils", "lib", "app"]


        def test_repeated_dependency():
            assert topo_sort({"a": ["b", "b"]}) == ["b", "a"]


        def test_empty():
            assert topo_sort({}) == []


        def test_cycle_is_reported():
            with pytest.raises(CycleError) as excinfo:
                topo_sort({"build": ["fetch"], "fetch": ["config"], "config": ["build"], "docs": []})
            assert isinstance(excinfo.value, ValueError)
            assert all(name in str(excinfo.value) for name in ("build", "fetch", "config"))


        def test_self_loop_is_a_cycle():
            with pytest.raises(CycleError):
                topo_sort({"x": ["x"]})
    ''')},
    command=f"{PYTEST} test_toposort.py",
    solution=[
        step("Kahn's algorithm with a heap of ready nodes gives the alphabetical tie-break; dependencies go into sets so repeats count once.",
             write("toposort.py", d('''
                import heapq


                class CycleError(ValueError):
                    """The dependency graph has a cycle."""


                def topo_sort(deps):
                    """Nodes ordered after their dependencies, alphabetically smallest ready node first."""
                    needs = {}
                    for node, wanted in deps.items():
                        needs.setdefault(node, set()).update(wanted)
                        for dep in wanted:
                            needs.setdefault(dep, set())
                    dependents = {node: [] for node in needs}
                    for node, wanted in needs.items():
                        for dep in wanted:
                            dependents[dep].append(node)
                    waiting = {node: len(wanted) for node, wanted in needs.items()}
                    ready = [node for node, count in waiting.items() if count == 0]
                    heapq.heapify(ready)
                    order = []
                    while ready:
                        node = heapq.heappop(ready)
                        order.append(node)
                        for dependent in dependents[node]:
                            waiting[dependent] -= 1
                            if waiting[dependent] == 0:
                                heapq.heappush(ready, dependent)
                    if len(order) < len(needs):
                        stuck = sorted(node for node, count in waiting.items() if count > 0)
                        raise CycleError(f"dependency cycle among: {', '.join(stuck)}")
                    return order
             '''))),
        step("Check ordering, the tie-break and the cycle error.",
             shell("python3 -c \"from toposort import topo_sort; print(topo_sort({'z': [], 'y': ['z'], 'a': ['y'], 'm': []})); "
                   "print(topo_sort({'app': ['lib', 'utils'], 'lib': ['utils']}))\" && "
                   "python3 -c \"from toposort import topo_sort; topo_sort({'a': ['b'], 'b': ['a']})\" 2>&1 | tail -1")),
        step("Now the provided tests.", shell("python3 -m pytest -q test_toposort.py")),
        step("['m', 'z', 'y', 'a'] and ['utils', 'lib', 'app'] as expected, and the cycle raises CycleError naming a and b; the provided tests pass.",
             finish("toposort.py: Kahn's algorithm with a min-heap for alphabetical ties; CycleError (a ValueError) names the nodes left on the cycle.")),
    ],
)

# -- 004 Dijkstra ---------------------------------------------------------------------------
task(
    "code-004-dijkstra",
    """Write routes.py with a function shortest_path(edges, start, goal). edges is a list of
    (from_town, to_town, cost) triples, each a one-way road; towns are strings and costs are
    non-negative numbers. Return a tuple (total_cost, path) where path is the list of towns from
    start to goal, both included, along a cheapest route. If goal cannot be reached, return
    (math.inf, []). If start == goal, return (0, [start]), even for a town that appears in no
    edge. Raise ValueError if any cost is negative.""",
    verifier_files={"test_routes.py": d('''
        import math

        import pytest

        from routes import shortest_path

        ROADS = [("A", "B", 4), ("A", "C", 1), ("C", "B", 2), ("B", "D", 1), ("C", "D", 5)]


        def test_cheapest_route():
            assert shortest_path(ROADS, "A", "D") == (4, ["A", "C", "B", "D"])


        def test_roads_are_one_way():
            assert shortest_path(ROADS, "D", "A") == (math.inf, [])


        def test_start_is_goal():
            assert shortest_path(ROADS, "A", "A") == (0, ["A"])
            assert shortest_path([], "X", "X") == (0, ["X"])


        def test_unknown_goal():
            assert shortest_path(ROADS, "A", "Z") == (math.inf, [])


        def test_fractional_costs():
            cost, path = shortest_path([("a", "b", 0.5), ("b", "c", 0.25), ("a", "c", 1.0)], "a", "c")
            assert cost == pytest.approx(0.75) and path == ["a", "b", "c"]


        def test_negative_cost_is_rejected():
            with pytest.raises(ValueError):
                shortest_path([("a", "b", 1), ("b", "c", -2)], "a", "c")


        def test_grid_path_is_consistent():
            n = 30
            edges = []
            for r in range(n):
                for c in range(n):
                    if c + 1 < n:
                        edges.append((f"{r},{c}", f"{r},{c + 1}", 1 + (r * 7 + c * 3) % 5))
                    if r + 1 < n:
                        edges.append((f"{r},{c}", f"{r + 1},{c}", 1 + (r * 5 + c * 11) % 4))
            cost, path = shortest_path(edges, "0,0", f"{n - 1},{n - 1}")
            weight = {(a, b): w for a, b, w in edges}
            assert path[0] == "0,0" and path[-1] == f"{n - 1},{n - 1}"
            assert sum(weight[(a, b)] for a, b in zip(path, path[1:])) == cost
            assert cost == 74
    ''')},
    command=f"{PYTEST} test_routes.py",
    solution=[
        step("Dijkstra with a heap and predecessor links; a counter in the heap entries keeps town names from being compared.",
             write("routes.py", d('''
                import heapq
                import itertools
                import math


                def shortest_path(edges, start, goal):
                    """(cost, [start, ..., goal]) of a cheapest route over one-way roads, (inf, []) if none."""
                    graph = {}
                    for source, target, cost in edges:
                        if cost < 0:
                            raise ValueError(f"negative cost {cost} on {source} -> {target}")
                        graph.setdefault(source, []).append((target, cost))
                    if start == goal:
                        return 0, [start]
                    best = {start: 0}
                    previous = {}
                    tie = itertools.count()
                    heap = [(0, next(tie), start)]
                    done = set()
                    while heap:
                        cost, _, town = heapq.heappop(heap)
                        if town in done:
                            continue
                        if town == goal:
                            path = [goal]
                            while path[-1] != start:
                                path.append(previous[path[-1]])
                            return cost, path[::-1]
                        done.add(town)
                        for target, step_cost in graph.get(town, ()):
                            new_cost = cost + step_cost
                            if target not in best or new_cost < best[target]:
                                best[target] = new_cost
                                previous[target] = town
                                heapq.heappush(heap, (new_cost, next(tie), target))
                    return math.inf, []
             '''))),
        step("Try the example network, an unreachable goal and a negative cost.",
             shell("python3 -c \"from routes import shortest_path as sp; r=[('A','B',4),('A','C',1),('C','B',2),('B','D',1),('C','D',5)]; "
                   "print(sp(r,'A','D'), sp(r,'D','A'), sp(r,'A','A'))\" && "
                   "python3 -c \"from routes import shortest_path as sp; sp([('a','b',-1)],'a','b')\" 2>&1 | tail -1")),
        step("The workspace has test_routes.py; run it too.", shell("python3 -m pytest -q test_routes.py")),
        step("(4, ['A', 'C', 'B', 'D']), (inf, []), (0, ['A']) and a ValueError; the provided tests pass too.",
             finish("routes.py: shortest_path runs Dijkstra over the one-way roads and returns (cost, path), (inf, []) when unreachable.")),
    ],
)

# -- 005 Roman numerals ---------------------------------------------------------------------
task(
    "code-005-roman-numerals",
    """Write roman.py with two functions. to_roman(n) converts an integer from 1 to 3999 to an
    uppercase Roman numeral and raises ValueError outside that range. from_roman(s) converts a
    Roman numeral back to an integer; it accepts only canonical uppercase numerals, exactly the
    strings to_roman produces, and raises ValueError for anything else (for example "IIII",
    "IC", "VX", "", "mcm" or "MMMM").""",
    verifier_files={"test_roman.py": d('''
        import pytest

        from roman import from_roman, to_roman

        PAIRS = [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"), (400, "CD"),
                 (1994, "MCMXCIV"), (2024, "MMXXIV"), (3999, "MMMCMXCIX")]


        @pytest.mark.parametrize("n, numeral", PAIRS)
        def test_to_roman(n, numeral):
            assert to_roman(n) == numeral


        @pytest.mark.parametrize("n, numeral", PAIRS)
        def test_from_roman(n, numeral):
            assert from_roman(numeral) == n


        @pytest.mark.parametrize("n", [0, -1, 4000])
        def test_to_roman_range(n):
            with pytest.raises(ValueError):
                to_roman(n)


        @pytest.mark.parametrize("text", ["IIII", "IC", "VX", "", "mcm", "MMMM", "XIIV", "IIX", "MCMC", "ABC"])
        def test_from_roman_rejects_non_canonical(text):
            with pytest.raises(ValueError):
                from_roman(text)


        def test_round_trip():
            assert all(from_roman(to_roman(n)) == n for n in range(1, 4000))
    ''')},
    command=f"{PYTEST} test_roman.py",
    solution=[
        step("Greedy conversion both ways; from_roman then checks the result converts back to the same string, which rules out every non-canonical form.",
             write("roman.py", d('''
                NUMERALS = [
                    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"),
                    (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
                    (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
                ]


                def to_roman(n):
                    """1..3999 -> canonical uppercase Roman numeral."""
                    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n < 4000:
                        raise ValueError(f"out of range 1..3999: {n!r}")
                    out = []
                    for value, numeral in NUMERALS:
                        while n >= value:
                            out.append(numeral)
                            n -= value
                    return "".join(out)


                def from_roman(s):
                    """Canonical uppercase Roman numeral -> int; ValueError for anything else."""
                    if not isinstance(s, str) or not s:
                        raise ValueError(f"not a Roman numeral: {s!r}")
                    total, i = 0, 0
                    for value, numeral in NUMERALS:
                        while s.startswith(numeral, i):
                            total += value
                            i += len(numeral)
                    if i != len(s) or not 0 < total < 4000 or to_roman(total) != s:
                        raise ValueError(f"not a canonical Roman numeral: {s!r}")
                    return total
             '''))),
        step("Round-trip everything and make sure the bad inputs are rejected.",
             shell("python3 - <<'EOF'\nfrom roman import from_roman, to_roman\n"
                   "assert all(from_roman(to_roman(n)) == n for n in range(1, 4000))\n"
                   "for bad in ['IIII', 'IC', 'VX', '', 'mcm', 'MMMM']:\n"
                   "    try:\n        from_roman(bad)\n    except ValueError:\n        continue\n"
                   "    raise SystemExit(f'accepted {bad!r}')\nprint(to_roman(1994), 'ok')\nEOF")),
        step("And the provided test file.", shell("python3 -m pytest -q test_roman.py")),
        step("Prints MCMXCIV ok; the provided tests pass.", finish("roman.py: to_roman (1..3999) and a strict from_roman that only accepts canonical numerals.")),
    ],
)

# -- 006 run-length encoding ----------------------------------------------------------------
task(
    "code-006-run-length-encoding",
    """Write rle.py with encode(text) and decode(data) for run-length encoding. encode replaces
    each run of one repeated character by the run's length followed by the character, always
    writing the count: encode("aaabccdddd") == "3a1b2c4d", and runs longer than 9 get a
    multi-digit count (encode("x" * 12) == "12x"). Any character except digits may occur (spaces,
    newlines, non-ASCII letters); encode raises ValueError if text contains a digit. decode is the
    exact inverse and raises ValueError for malformed input: a character without a count before
    it, a count starting with 0, or a count at the end without a character. Both map "" to "".""",
    verifier_files={"test_rle.py": d('''
        import pytest

        from rle import decode, encode


        def test_encode():
            assert encode("aaabccdddd") == "3a1b2c4d"
            assert encode("abc") == "1a1b1c"


        def test_encode_multi_digit_runs():
            assert encode("x" * 12) == "12x"
            assert encode("y" * 100 + "z") == "100y1z"


        def test_empty():
            assert encode("") == "" and decode("") == ""


        def test_encode_rejects_digits():
            with pytest.raises(ValueError):
                encode("ab1")


        def test_decode():
            assert decode("3a1b2c4d") == "aaabccdddd"
            assert decode("12x1 ") == "x" * 12 + " "


        @pytest.mark.parametrize("data", ["a", "3", "3a2", "0a", "03a", "a3"])
        def test_decode_rejects_malformed(data):
            with pytest.raises(ValueError):
                decode(data)


        def test_round_trip_of_awkward_text():
            text = "  héé\\n\\n\\tzzz!!"
            assert decode(encode(text)) == text
    ''')},
    command=f"{PYTEST} test_rle.py",
    solution=[
        step(None, shell("ls -la")),
        step("groupby for encoding; for decoding a full-match regex of count+character pairs rejects malformed input in one place.",
             write("rle.py", d(r'''
                import re
                from itertools import groupby

                _PAIRS = re.compile(r"([1-9][0-9]*)([^0-9])", re.DOTALL)


                def encode(text):
                    """'aaab' -> '3a1b'; ValueError if text contains a digit."""
                    if any(ch.isdigit() for ch in text):
                        raise ValueError("text must not contain digits")
                    return "".join(f"{len(list(run))}{ch}" for ch, run in groupby(text))


                def decode(data):
                    """'3a1b' -> 'aaab'; ValueError for malformed input."""
                    out, pos = [], 0
                    for match in _PAIRS.finditer(data):
                        if match.start() != pos:
                            break
                        out.append(match.group(2) * int(match.group(1)))
                        pos = match.end()
                    if pos != len(data):
                        raise ValueError(f"malformed run-length data at position {pos}: {data!r}")
                    return "".join(out)
             '''))),
        step("Check the examples, a round trip with whitespace and the error cases.",
             shell("python3 - <<'EOF'\nfrom rle import decode, encode\n"
                   "print(encode('aaabccdddd'), encode('x' * 12))\n"
                   "t = '  h\\u00e9\\u00e9\\n\\n zz'\nassert decode(encode(t)) == t\n"
                   "for bad in ['a', '3', '3a2', '0a']:\n"
                   "    try:\n        decode(bad)\n    except ValueError:\n        continue\n"
                   "    raise SystemExit(f'accepted {bad!r}')\nprint('ok')\nEOF")),
        step("Run the given tests as well.", shell("python3 -m pytest -q test_rle.py")),
        step("3a1b2c4d 12x ok; the provided tests pass.", finish("rle.py: encode/decode with always-written counts; malformed data and digits in text raise ValueError.")),
    ],
)

# -- 007 edit distance ----------------------------------------------------------------------
task(
    "code-007-edit-distance",
    """Write fuzzy.py with two functions. levenshtein(a, b) returns the edit distance between two
    strings, where an insertion, a deletion and a substitution each cost 1; it is case-sensitive
    and must handle two strings of 1,000 characters in a few seconds at most.
    suggest(word, vocabulary, max_distance=2) returns the list of words from vocabulary whose
    distance to word is at most max_distance, comparing case-insensitively but returning the
    words as given, closest first; words at equal distance keep their order in vocabulary.""",
    verifier_files={"test_fuzzy.py": d('''
        import pytest

        from fuzzy import levenshtein, suggest


        @pytest.mark.parametrize("a, b, distance", [
            ("kitten", "sitting", 3), ("", "abc", 3), ("abc", "", 3), ("flaw", "lawn", 2),
            ("same", "same", 0), ("abc", "ABC", 3), ("ab", "ba", 2),
        ])
        def test_levenshtein(a, b, distance):
            assert levenshtein(a, b) == distance


        def test_levenshtein_long_strings():
            assert levenshtein("ab" * 500, "ba" * 500) == 2
            assert levenshtein("a" * 1000, "a" * 999 + "b") == 1


        def test_suggest_orders_by_distance_then_input_order():
            vocabulary = ["maple", "apply", "apple", "ample", "applesauce", "apples"]
            assert suggest("appel", vocabulary) == ["apply", "apple", "apples"]


        def test_suggest_is_case_insensitive():
            assert suggest("PYTHON", ["Python", "typhoon", "pythons", "java"]) == ["Python", "pythons"]


        def test_suggest_max_distance():
            assert suggest("cat", ["cat", "cart", "Cat", "dog"], max_distance=0) == ["cat", "Cat"]
            assert suggest("cat", ["dog"]) == []
    ''')},
    command=f"{PYTEST} test_fuzzy.py",
    solution=[
        step("Two-row dynamic programming keeps levenshtein O(len(a)*len(b)) time and O(len(b)) memory; suggest uses a stable sort on distance.",
             write("fuzzy.py", d('''
                def levenshtein(a, b):
                    """Edit distance with unit-cost insertions, deletions and substitutions."""
                    if len(a) < len(b):
                        a, b = b, a
                    previous = list(range(len(b) + 1))
                    for i, ca in enumerate(a, 1):
                        current = [i]
                        for j, cb in enumerate(b, 1):
                            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
                        previous = current
                    return previous[-1]


                def suggest(word, vocabulary, max_distance=2):
                    """Vocabulary words within max_distance of word (case-insensitive), closest first."""
                    target = word.lower()
                    scored = [(levenshtein(target, candidate.lower()), candidate) for candidate in vocabulary]
                    close = [pair for pair in scored if pair[0] <= max_distance]
                    return [candidate for _, candidate in sorted(close, key=lambda pair: pair[0])]
             '''))),
        step("Check the classic examples and time the 1,000-character case.",
             shell("python3 -c \"from fuzzy import levenshtein as l, suggest; print(l('kitten', 'sitting'), l('flaw', 'lawn')); "
                   "print(suggest('appel', ['maple', 'apply', 'apple', 'ample', 'applesauce']))\" && "
                   "time python3 -c \"from fuzzy import levenshtein; print(levenshtein('ab' * 500, 'ba' * 500))\"")),
        step("Now the provided tests.", shell("python3 -m pytest -q test_fuzzy.py")),
        step("3 2, sensible suggestions, and the long case prints 2 well within a second; the provided tests pass.",
             finish("fuzzy.py: two-row DP levenshtein and suggest() with a stable, case-insensitive distance ranking.")),
    ],
)
