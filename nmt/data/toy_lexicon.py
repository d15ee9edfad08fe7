"""The toy corpus's lexicon: English and German words with the grammar they carry.

Nouns with gender and plural, verbs with their German case frame and particles,
adjectives, prepositions with the case they govern, determiners and number words.
`nmt.data.toy_corpus` builds sentences from these tables: any change to them changes
the generated corpus, which a test compares byte for byte with `data/toy`.
"""

from __future__ import annotations

from dataclasses import dataclass

GENDERS = ("m", "f", "n", "pl")  # German gender, or plural (which has none)
CASES = ("nom", "acc", "dat")

# Noun kinds: p person, a animal, t thing, f food, m mass food, w drink, l place.


def _paradigm(nom: str, acc: str, dat: str) -> dict[str, dict[str, str]]:
    """Forms by case, then by gender or plural (columns m f n pl); '-' is an empty ending."""
    rows = zip(CASES, (nom, acc, dat), strict=True)
    return {case: dict(zip(GENDERS, row.replace("-", "").split(" "), strict=True)) for case, row in rows}


DEFINITE = _paradigm("der die das die", "den die das die", "dem der dem den")
RELATIVE = _paradigm("der die das die", "den die das die", "dem der dem denen")
DER_WORD = _paradigm("er e es e", "en e es e", "em er em en")  # dies-er, dies-e, dies-es
EIN_WORD = _paradigm("- e - e", "en e - e", "em er em en")  # ein, ein-e, ein-en, kein-e
# Adjective endings: weak after der-words, mixed after ein-words, strong without article.
ADJ_ENDINGS = {
    "definite": _paradigm("e e e en", "en e e en", "en en en en"),
    "der": _paradigm("e e e en", "en e e en", "en en en en"),
    "ein": _paradigm("er e es en", "en e es en", "en en en en"),
    "bare": _paradigm("er e es e", "en e es e", "em er em en"),
}


@dataclass(frozen=True)
class Noun:
    en: str
    en_pl: str  # '-' for mass nouns, which are never plural
    de: str
    de_pl: str
    gender: str  # m, f or n
    kind: str


@dataclass(frozen=True)
class Verb:
    kind: str  # i intransitive, t accusative object, d dative object, g give-type, s 'that'-clause, m modal
    objects: str  # noun kinds allowed as object
    subjects: str  # noun kinds allowed as subject
    en: str  # 3rd person singular template; {o} is the object, {i} the recipient
    en_pl: str  # plural and infinitive template
    de: str  # 3rd person singular (without the separable particle)
    de_pl: str  # plural, which is also the infinitive (without the particle)
    particle: str  # separable prefix: clause-final in main clauses, fused in verb-final order


@dataclass(frozen=True)
class Word:
    """Adjective, preposition, adverb or conjunction: one translation, `tag` as the table says."""

    en: str
    de: str
    tag: str = ""  # adjective: noun kinds; preposition: "case kinds"


@dataclass(frozen=True)
class Determiner:
    en: str
    en_pl: str  # '' where the plural has no article ("a dog" -> "dogs")
    de: str  # stem the endings attach to
    kind: str  # definite, der (der-word), ein (ein-word) or bare: picks the paradigms


def _entries(table: str) -> list[tuple[str, str, str]]:
    """(header, English, German) for each 'header: en = de; en = de' table entry."""
    rows = [line.split(":") if ":" in line else ("", line) for line in table.strip().splitlines()]
    return [(head.strip(), *(side.strip() for side in entry.split("=")))
            for head, entries in rows for entry in entries.split(";")]


def english_plural_verb(form: str) -> str:
    """English 3rd person singular -> plural/infinitive, on the first word only:
    cries -> cry, washes -> wash, goes -> go, sees -> see; "can" and "must" stay."""
    first, _, rest = form.partition(" ")
    if first.endswith("ies"):
        first = first[:-3] + "y"
    elif first.endswith(("sses", "shes", "ches", "xes", "oes")):
        first = first[:-2]
    elif first.endswith("s"):
        first = first[:-1]
    return f"{first} {rest}".strip()


NOUNS = tuple(sorted((Noun(*en.split(), *de.split(), kind) for kind, en, de in _entries("""
p: man men = Mann Männer m; woman women = Frau Frauen f; child children = Kind Kinder n
p: girl girls = Mädchen Mädchen n; teacher teachers = Lehrer Lehrer m; doctor doctors = Arzt Ärzte m
p: friend friends = Freund Freunde m; sister sisters = Schwester Schwestern f; aunt aunts = Tante Tanten f
p: brother brothers = Bruder Brüder m; mother mothers = Mutter Mütter f; father fathers = Vater Väter m
p: daughter daughters = Tochter Töchter f; son sons = Sohn Söhne m; cook cooks = Koch Köche m
p: baker bakers = Bäcker Bäcker m; king kings = König Könige m; queen queens = Königin Königinnen f
p: driver drivers = Fahrer Fahrer m; guest guests = Gast Gäste m; uncle uncles = Onkel Onkel m
p: waiter waiters = Kellner Kellner m
a: dog dogs = Hund Hunde m; cat cats = Katze Katzen f; horse horses = Pferd Pferde n; cow cows = Kuh Kühe f
a: bird birds = Vogel Vögel m; mouse mice = Maus Mäuse f; pig pigs = Schwein Schweine n
a: fox foxes = Fuchs Füchse m; wolf wolves = Wolf Wölfe m; duck ducks = Ente Enten f
a: goat goats = Ziege Ziegen f; chicken chickens = Huhn Hühner n; donkey donkeys = Esel Esel m
a: frog frogs = Frosch Frösche m; owl owls = Eule Eulen f
t: book books = Buch Bücher n; ball balls = Ball Bälle m; car cars = Auto Autos n; cup cups = Tasse Tassen f
t: table tables = Tisch Tische m; chair chairs = Stuhl Stühle m; door doors = Tür Türen f
t: window windows = Fenster Fenster n; letter letters = Brief Briefe m; key keys = Schlüssel Schlüssel m
t: bottle bottles = Flasche Flaschen f; lamp lamps = Lampe Lampen f; hat hats = Hut Hüte m
t: shoe shoes = Schuh Schuhe m; bag bags = Tasche Taschen f; box boxes = Kiste Kisten f
t: clock clocks = Uhr Uhren f; picture pictures = Bild Bilder n; flower flowers = Blume Blumen f
t: knife knives = Messer Messer n; boat boats = Boot Boote n; bicycle bicycles = Fahrrad Fahrräder n
t: phone phones = Telefon Telefone n; radio radios = Radio Radios n; coat coats = Mantel Mäntel m
t: newspaper newspapers = Zeitung Zeitungen f; umbrella umbrellas = Schirm Schirme m
t: gift gifts = Geschenk Geschenke n
f: apple apples = Apfel Äpfel m; cake cakes = Kuchen Kuchen m; egg eggs = Ei Eier n
f: pear pears = Birne Birnen f; banana bananas = Banane Bananen f; sausage sausages = Wurst Würste f
f: potato potatoes = Kartoffel Kartoffeln f
m: bread - = Brot - n; soup - = Suppe - f; cheese - = Käse - m; rice - = Reis - m
w: water - = Wasser - n; milk - = Milch - f; coffee - = Kaffee - m; tea - = Tee - m
l: station stations = Bahnhof Bahnhöfe m; school schools = Schule Schulen f; city cities = Stadt Städte f
l: village villages = Dorf Dörfer n; garden gardens = Garten Gärten m; park parks = Park Parks m
l: market markets = Markt Märkte m; church churches = Kirche Kirchen f; forest forests = Wald Wälder m
l: house houses = Haus Häuser n; kitchen kitchens = Küche Küchen f; street streets = Straße Straßen f
""")), key=lambda noun: noun.en))

ADJECTIVES = tuple(sorted((Word(en, de, kinds) for kinds, en, de in _entries("""
pa: young = jung; happy = glücklich; sad = traurig; hungry = hungrig; clever = klug; rich = reich
pa: poor = arm; friendly = freundlich; famous = berühmt; loud = laut; quiet = ruhig
pat: fast = schnell; slow = langsam
patl: big = groß; small = klein; old = alt; beautiful = schön; ugly = hässlich; strange = seltsam
atl: red = rot; green = grün; blue = blau; black = schwarz; white = weiß; yellow = gelb; brown = braun
tl: new = neu; clean = sauber; cheap = billig
fmw: fresh = frisch; hot = heiß; cold = kalt; sweet = süß
""")), key=lambda adj: adj.en))

NAMES = tuple(sorted("""
Anna Peter Maria Thomas Julia Lukas Sophie Felix Emma Paul Laura Jonas Lena David Sarah
Daniel Nina Oskar Clara Max Ingrid Kwame Yuki Zoltan Priya Mateo Aisha Olga Sven Fatima
""".split()))


def _verb(head: str, en: str, de: str) -> Verb:
    kind, objects, subjects = head.split()
    de_3sg, de_pl, *particle = de.split()
    return Verb(kind, objects, subjects, en, english_plural_verb(en), de_3sg, de_pl, "".join(particle))


# header: kind, object kinds, subject kinds; German: 3sg, plural/infinitive, separable particle
VERBS = tuple(_verb(*entry) for entry in _entries("""
i - pa: sleeps = schläft schlafen; waits = wartet warten; swims = schwimmt schwimmen; runs = läuft laufen
i - pa: cries = weint weinen; arrives = kommt kommen an; comes back = kommt kommen zurück
i - pa: falls asleep = schläft schlafen ein; gets up = steht stehen auf
i - p: laughs = lacht lachen; works = arbeitet arbeiten; sings = singt singen; dances = tanzt tanzen
i - p: goes shopping = kauft kaufen ein
t pa pa: sees {o} = sieht sehen; hears {o} = hört hören; loves {o} = liebt lieben
t pal pa: visits {o} = besucht besuchen; finds {o} = findet finden; looks at {o} = sieht sehen an
t fm pa: eats {o} = isst essen
t w pa: drinks {o} = trinkt trinken
t atf p: carries {o} = trägt tragen; takes {o} along = nimmt nehmen mit
t tfmw p: buys {o} = kauft kaufen; sells {o} = verkauft verkaufen
t t p: reads {o} = liest lesen; opens {o} = macht machen auf; closes {o} = macht machen zu
t t p: switches {o} on = schaltet schalten ein; switches {o} off = schaltet schalten aus
t t p: brings {o} back = bringt bringen zurück
t patl p: paints {o} = malt malen; washes {o} = wäscht waschen
t pa p: calls {o} up = ruft rufen an; picks {o} up = holt holen ab; invites {o} = lädt laden ein
d pa pa: helps {o} = hilft helfen; follows {o} = folgt folgen
d p p: thanks {o} = dankt danken; answers {o} = antwortet antworten
g t p: gives {o} to {i} = gibt geben; sends {o} to {i} = schickt schicken; shows {o} to {i} = zeigt zeigen
g tfmw p: brings {o} to {i} = bringt bringen
s - p: says that = sagt sagen; thinks that = denkt denken; knows that = weiß wissen; hopes that = hofft hoffen
m - pa: can = kann können; must = muss müssen; wants to = will wollen
"""))
MODALS = tuple(v for v in VERBS if v.kind == "m")

PREPS = tuple(Word(en, de, tag) for tag, en, de in _entries("""
dat patf: with = mit
dat pl: from = von
dat l: in = in
dat tl: behind = hinter; in front of = vor
dat patl: next to = neben
acc pa: for = für
acc patf: without = ohne
acc l: through = durch
acc tl: around = um
"""))
CONTRACTIONS = {("in", "dem"): "im", ("von", "dem"): "vom"}  # preposition + definite dative

DETERMINERS = {d.en: d for d in (
    Determiner("the", "the", "d", "definite"), Determiner("this", "these", "dies", "der"),
    Determiner("a", "", "ein", "ein"), Determiner("no", "no", "kein", "ein"),
    Determiner("my", "my", "mein", "ein"), Determiner("his", "his", "sein", "ein"),
    Determiner("her", "her", "ihr", "ein"), Determiner("our", "our", "unser", "ein"),
    Determiner("", "", "", "bare"),
)}

ADVERBS = tuple(Word(en, de) for _, en, de in _entries("""
today = heute; tomorrow = morgen; now = jetzt; often = oft; sometimes = manchmal; later = später
in the morning = am Morgen; in the evening = am Abend; every day = jeden Tag
"""))
SUBORDINATORS = tuple(Word(en, de) for _, en, de in _entries("""
because = weil; although = obwohl; while = während; if = wenn; before = bevor; after = nachdem
"""))
COORDINATORS = (Word("and", "und"), Word("but", ", aber"), Word("or", "oder"))

EN_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
            "fourteen fifteen sixteen seventeen eighteen nineteen").split()
EN_TENS = "- - twenty thirty forty fifty sixty seventy eighty ninety".split()
DE_UNITS = ("null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn "
            "vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn").split()
DE_TENS = "- - zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split()

NOUN = {n.en: n for n in NOUNS}
VERB = {v.en: v for v in VERBS}
PREP = {p.en: p for p in PREPS}
ADJECTIVE = {a.en: a for a in ADJECTIVES}
