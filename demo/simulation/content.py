"""What the demo's runs talk about: customers, products, help-centre articles, research topics, and
the sentences pages and narration are made of."""

from __future__ import annotations

FIRST_NAMES = (
    "Ana",
    "Ben",
    "Chloe",
    "Dmitri",
    "Emma",
    "Farah",
    "Gustav",
    "Hana",
    "Ivan",
    "Jules",
    "Kofi",
    "Lena",
)
LAST_NAMES = (
    "Silva",
    "Okafor",
    "Martin",
    "Novak",
    "Schmidt",
    "Haddad",
    "Larsen",
    "Tanaka",
    "Rossi",
    "Dubois",
)
PRODUCTS = (
    ("SKU-TR2-42", "Trail Runner 2 shoes, size 42", 129.0),
    ("SKU-HP-X9", "X9 noise-cancelling headphones", 249.0),
    ("SKU-MUG-BL", "blue ceramic mug", 14.5),
    ("SKU-KB-75", "75% mechanical keyboard", 159.0),
    ("SKU-BAG-30", "30 L hiking backpack", 89.0),
    ("SKU-LAMP-D", "desk lamp with dimmer", 45.0),
    ("SKU-JKT-M", "rain jacket, size M", 119.0),
)
CARRIERS = ("DHL", "UPS", "PostNord", "GLS", "DPD")
ORDER_STATUS_SYNONYMS = ("open", "pending", "in progress", "not delivered")

# (question, search query, article id, title, answer, query synonyms)
FAQS: tuple[tuple[str, str, str, str, str, tuple[str, ...]], ...] = (
    (
        "How long do I have to return shoes I bought online?",
        "return window shoes",
        "KB-101",
        "Returns and refunds",
        "You can return unworn shoes within 30 days of delivery; the return label is free.",
        ("return period shoes", "shoe return deadline", "how long to send back shoes"),
    ),
    (
        "Do you ship to Norway?",
        "shipping to Norway",
        "KB-214",
        "Shipping destinations and customs",
        "Yes, we ship to Norway; customs duties are paid on delivery.",
        ("delivery to Norway", "ship Norway customs", "international shipping Norway"),
    ),
    (
        "How do I change my delivery address?",
        "change delivery address",
        "KB-118",
        "Changing an order after checkout",
        "You can change the address until the order is packed, under Orders → Edit.",
        ("update shipping address", "modify delivery address", "edit address after order"),
    ),
    (
        "Can I pay with Klarna?",
        "payment methods klarna",
        "KB-305",
        "Payment methods",
        "Yes: Klarna is offered at checkout for orders from 35 EUR.",
        ("klarna payment", "pay later klarna", "buy now pay later options"),
    ),
    (
        "My discount code doesn't work, why?",
        "discount code not applied",
        "KB-322",
        "Discount codes",
        "Codes do not combine with sale items and expire at midnight CET.",
        ("promo code not working", "voucher code rejected", "coupon not applied"),
    ),
    (
        "What's the warranty on headphones?",
        "headphones warranty",
        "KB-410",
        "Warranty terms",
        "Headphones carry a two-year warranty covering manufacturing defects.",
        ("headphone guarantee", "warranty period headphones", "headphones defect coverage"),
    ),
)

# (topic, synonyms of its base query)
RESEARCH_TOPICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "EU battery regulation recycling targets",
        ("EU battery law recycling quotas", "European battery regulation recovery goals"),
    ),
    (
        "heat pump adoption in the Nordics",
        ("heat pump uptake Nordic countries", "Scandinavia heat pump market"),
    ),
    ("LLM inference price trends", ("large language model serving cost trend", "LLM API pricing over time")),
    (
        "Asia-Europe container freight rates",
        ("container shipping rates Asia Europe", "Shanghai Rotterdam freight"),
    ),
    ("lithium supply outlook", ("lithium production forecast", "lithium mining supply projections")),
    (
        "urban bike lane safety evidence",
        ("protected cycle lanes injury studies", "bike infrastructure safety"),
    ),
)
FACETS = (
    "overview",
    "statistics 2024",
    "policy changes",
    "market size",
    "key players",
    "criticism",
    "forecast 2030",
    "regional differences",
    "methodology",
    "recent news",
    "academic review",
    "cost breakdown",
    "case study",
    "timeline",
    "open questions",
)
DOMAINS = (
    "reuters.com",
    "ec.europa.eu",
    "arxiv.org",
    "iea.org",
    "ft.com",
    "nature.com",
    "statista.com",
    "en.wikipedia.org",
    "oecd.org",
    "bloomberg.com",
)
SENTENCES = (
    "The figures were revised upward in the latest release.",
    "Analysts disagree on how quickly the trend will continue.",
    "Regional differences remain large, with the north leading.",
    "The report cites three main drivers: price, policy and supply.",
    "Data before 2020 are sparse and not directly comparable.",
    "Several sources point to a slowdown in the second half of the year.",
    "The methodology changed in 2023, which breaks the series.",
    "Industry groups contest the estimate as too conservative.",
    "Independent audits confirm the headline number within 5%.",
    "The regulation phases in over four years from its adoption.",
)
NARRATION = (
    "Let me check that for you.",
    "I'll look this up.",
    "Looking at the details now.",
    "One moment while I check the records.",
    "Checking a second source.",
    "I'm gathering the remaining details.",
)
