"""Lexicons for the BranchMemEval-style realizer: large enough that chance collisions between sessions are rare."""

import re

FIRST_NAMES = (
    "Amara", "Jonas", "Mei", "Tiago", "Aisha", "Kenji", "Sofia", "Mateo", "Priya", "Lars",
    "Ingrid", "Olumide", "Chiamaka", "Dmitri", "Anya", "Farhan", "Leila", "Nikolai", "Yuki", "Hiroshi",
    "Soren", "Freya", "Emeka", "Zainab", "Rafael", "Camila", "Arjun", "Ananya", "Kwame", "Abena",
    "Liang", "Xiu", "Hamid", "Yasmin", "Bjorn", "Astrid", "Pedro", "Lucia", "Omar", "Fatima",
    "Tomas", "Elena", "Ravi", "Meera", "Ling", "Kofi", "Efua", "Diego", "Valentina", "Ivan",
    "Katya", "Mikael", "Sanna", "Hassan", "Nadia", "Jin", "Soo", "Kai", "Lani", "Ngozi",
    "Tunde", "Mariana", "Joao", "Ines", "Rui", "Carmen", "Javier", "Pilar", "Andres", "Lucas",
    "Emma", "Noah", "Olivia", "Liam", "Ava", "Ethan", "Mia", "Oliver", "Isla", "Jack",
    "Grace", "Henry", "Chloe", "Samuel", "Ruby", "Daniel", "Hannah", "Leo", "Zoe", "Felix",
    "Clara", "Hugo", "Alice", "Oscar", "Lily", "Theo", "Nora", "Max", "Ella", "Finn",
    "Ivy", "Arthur", "Iris", "Julian", "Maya", "Sebastian", "Naomi", "Adrian", "Stella", "Gabriel",
    "Eva", "Elias", "Lena", "Matthias", "Greta", "Stefan", "Heidi", "Klaus", "Ute", "Jurgen",
    "Brigitte", "Pierre", "Amelie", "Julien", "Margaux", "Antoine", "Camille", "Luc", "Elodie", "Marco",
    "Giulia", "Luca", "Chiara", "Matteo", "Francesca", "Giorgio", "Alessia", "Paolo", "Serena", "Andrei",
    "Ioana", "Mihai", "Bogdan", "Irina", "Pavel", "Olga", "Sergei", "Tatiana", "Piotr", "Agnieszka",
    "Kasia", "Marek", "Zofia", "Jakub", "Radek", "Petra", "Ondrej", "Lucie", "Goran", "Jelena",
    "Nikola", "Milos", "Dragana", "Aleksandar", "Eleni", "Nikos", "Dimitra", "Yiannis", "Kostas", "Selin",
    "Emre", "Elif", "Mehmet", "Ayse", "Burak", "Reza", "Shirin", "Dariush", "Parisa", "Ali",
    "Layla", "Karim", "Rania", "Tariq", "Samira", "Yusuf", "Amina", "Ibrahim", "Khadija", "Youssef",
    "Salma", "Mustafa", "Noor", "Avi", "Tamar", "Noa", "Eitan", "Yael", "Ori", "Sipho",
    "Thandiwe", "Lerato", "Thabo", "Zanele", "Bongani", "Ayodele", "Folake", "Chidi", "Adaeze", "Obinna",
    "Yewande", "Kiptoo", "Wanjiru", "Otieno", "Akinyi", "Juma", "Neema", "Baraka", "Zawadi", "Haile",
    "Selam", "Dawit", "Meron", "Tesfaye", "Amani", "Moussa", "Aminata", "Mamadou", "Fatou", "Ousmane",
    "Awa", "Rohan", "Kavya", "Vikram", "Lakshmi", "Aditya", "Divya", "Nikhil", "Pooja", "Sanjay",
    "Anjali", "Rahul", "Sunita", "Imran", "Ayesha", "Bilal", "Sana", "Farah", "Tanvir", "Nusrat",
    "Rashid", "Dilnoza", "Timur", "Aigerim", "Nurlan", "Bolat", "Wei", "Fang", "Jun", "Yan",
    "Hao", "Xin", "Min", "Ji", "Hana", "Takeshi", "Akiko", "Haruto", "Sakura", "Ren",
    "Aoi", "Daisuke", "Emi", "Minjun", "Seoyeon", "Jiwoo", "Hyun", "Eun", "Thanh", "Linh",
    "Minh", "Huong", "Quang", "Somchai", "Niran", "Malee", "Arief", "Putri", "Budi", "Sari",
    "Rizal", "Jose", "Maria", "Miguel", "Rosa", "Luis", "Ana", "Carlos", "Paula", "Fernando",
    "Gabriela", "Ricardo", "Daniela", "Alejandro", "Ximena", "Renata", "Emilio", "Catalina", "Joaquin", "Florencia",
    "Bruno", "Leticia", "Thiago", "Larissa", "Caio", "Beatriz", "Rafaela", "Vinicius", "Manon", "Aroha",
    "Tane", "Mere", "Wiremu", "Kalani", "Keanu", "Leilani", "Nalani", "Malia", "Sione", "Losa",
    "Tavita", "Aputi", "Siku", "Tala", "Aiyana", "Winona", "Ciaran", "Siobhan", "Niamh", "Aoife",
    "Declan", "Eoin", "Saoirse", "Cormac", "Fiona", "Angus", "Morag", "Callum", "Eilidh", "Rhys",
    "Gwen", "Dylan", "Carys", "Owen", "Bryn", "Sigrid", "Erik", "Magnus", "Solveig", "Henrik",
    "Maja", "Anders", "Linnea", "Aino", "Eero", "Veera", "Juho", "Kristjan", "Liis", "Rasmus",
    "Karin", "Jonah",
)

LAST_NAMES = (
    "Silva", "Santos", "Oliveira", "Pereira", "Costa", "Ferreira", "Almeida", "Carvalho", "Gomes", "Ribeiro",
    "Martins", "Rocha", "Lopes", "Sousa", "Fernandes", "Garcia", "Martinez", "Rodriguez", "Hernandez", "Gonzalez",
    "Perez", "Sanchez", "Ramirez", "Torres", "Flores", "Rivera", "Morales", "Ortiz", "Castillo", "Vargas",
    "Romero", "Navarro", "Delgado", "Guerrero", "Herrera", "Medina", "Aguilar", "Castro", "Ruiz", "Alvarez",
    "Moreno", "Jimenez", "Iglesias", "Serrano", "Rossi", "Russo", "Ferrari", "Esposito", "Bianchi", "Romano",
    "Ricci", "Marino", "Greco", "Gallo", "Conti", "Lombardi", "Moretti", "Barbieri", "Fontana", "Santoro",
    "Mariani", "Rinaldi", "Caruso", "Galli", "Martini", "Leone", "Longo", "Gentile", "Martinelli", "Vitale",
    "Mueller", "Schmidt", "Schneider", "Fischer", "Weber", "Meyer", "Wagner", "Becker", "Schulz", "Hoffmann",
    "Koch", "Richter", "Klein", "Wolf", "Schroeder", "Neumann", "Schwarz", "Zimmermann", "Braun", "Hartmann",
    "Lange", "Krause", "Lehmann", "Dubois", "Durand", "Lefebvre", "Moreau", "Laurent", "Leroy", "Roux",
    "Bertrand", "Morel", "Fournier", "Girard", "Bonnet", "Dupont", "Lambert", "Fontaine", "Rousseau", "Faure",
    "Mercier", "Blanc", "Guerin", "Boyer", "Garnier", "Chevalier", "Gauthier", "Perrin", "Janssen", "Visser",
    "Smit", "Bakker", "Mulder", "Dekker", "Brouwer", "Hendriks", "Peeters", "Jacobs", "Maes", "Willems",
    "Claes", "Nielsen", "Jensen", "Hansen", "Pedersen", "Andersen", "Christensen", "Larsen", "Sorensen", "Johansson",
    "Karlsson", "Nilsson", "Eriksson", "Larsson", "Olsson", "Persson", "Svensson", "Gustafsson", "Lindqvist", "Lindberg",
    "Haugen", "Johansen", "Olsen", "Bakke", "Korhonen", "Virtanen", "Nieminen", "Makinen", "Laine", "Heikkinen",
    "Koskinen", "Jarvinen", "Kowalski", "Nowak", "Wisniewski", "Wojcik", "Kaminski", "Lewandowski", "Zielinski", "Szymanski",
    "Novak", "Svoboda", "Dvorak", "Cerny", "Prochazka", "Horvath", "Nagy", "Toth", "Szabo", "Kovacs",
    "Varga", "Popescu", "Ionescu", "Dumitru", "Petrov", "Ivanov", "Smirnov", "Kuznetsov", "Popov", "Sokolov",
    "Volkov", "Morozov", "Pavlov", "Kozlov", "Lebedev", "Novikov", "Shevchenko", "Kovalenko", "Bondarenko", "Tkachenko",
    "Jovanovic", "Petrovic", "Nikolic", "Markovic", "Djordjevic", "Horvat", "Kovacevic", "Babic", "Papadopoulos", "Nikolaidis",
    "Georgiou", "Yilmaz", "Kaya", "Demir", "Sahin", "Celik", "Yildiz", "Aydin", "Ozturk", "Arslan",
    "Dogan", "Hosseini", "Ahmadi", "Karimi", "Rezaei", "Moradi", "Haddad", "Khoury", "Nassar", "Saleh",
    "Mansour", "Farouk", "Hamdan", "Aziz", "Rahman", "Hussain", "Chaudhry", "Malik", "Qureshi", "Siddiqui",
    "Cohen", "Levi", "Mizrahi", "Peretz", "Friedman", "Katz", "Goldberg", "Rosen", "Shapiro", "Patel",
    "Sharma", "Singh", "Kumar", "Gupta", "Reddy", "Iyer", "Nair", "Menon", "Rao", "Desai",
    "Mehta", "Joshi", "Kapoor", "Banerjee", "Chatterjee", "Mukherjee", "Bose", "Pillai", "Krishnan", "Perera",
    "Jayasuriya", "Chen", "Wang", "Zhang", "Liu", "Yang", "Huang", "Zhao", "Zhou", "Xu",
    "Zhu", "Guo", "Lin", "Luo", "Gao", "Zheng", "Tanaka", "Suzuki", "Takahashi", "Watanabe",
    "Ito", "Yamamoto", "Nakamura", "Kobayashi", "Kato", "Yoshida", "Yamada", "Sasaki", "Matsumoto", "Inoue",
    "Kimura", "Hayashi", "Shimizu", "Mori", "Ikeda", "Hashimoto", "Kim", "Lee", "Park", "Choi",
    "Kang", "Cho", "Yoon", "Jang", "Lim", "Kwon", "Nguyen", "Tran", "Pham", "Hoang",
    "Phan", "Vu", "Dang", "Bui", "Ngo", "Duong", "Santoso", "Wijaya", "Susanto", "Hidayat",
    "Saputra", "Reyes", "Cruz", "Bautista", "Aquino", "Villanueva", "Ramos", "Okafor", "Okonkwo", "Adeyemi",
    "Balogun", "Eze", "Nwosu", "Adebayo", "Ogunleye", "Mensah", "Owusu", "Boateng", "Asante", "Osei",
    "Darko", "Kamau", "Mwangi", "Njoroge", "Ochieng", "Wanjiku", "Mutua", "Kiprop", "Tadesse", "Bekele",
    "Girma", "Diallo", "Traore", "Keita", "Toure", "Camara", "Ndiaye", "Diop", "Nkosi", "Dlamini",
    "Ndlovu", "Khumalo", "Mokoena", "Naidoo", "Botha", "Pretorius", "Smith", "Johnson", "Williams", "Brown",
    "Jones", "Miller", "Davis", "Wilson", "Anderson", "Taylor", "Thomas", "Moore", "Jackson", "Martin",
    "White", "Harris", "Thompson", "Clark", "Lewis", "Robinson", "Walker", "Young", "Allen", "King",
    "Wright", "Scott", "Hill", "Green", "Adams", "Baker", "Nelson", "Carter", "Mitchell", "Roberts",
    "Turner", "Phillips", "Campbell", "Parker", "Evans", "Edwards", "Collins", "Stewart", "Morris", "Murphy",
    "Cook", "Rogers", "Morgan", "Cooper", "Peterson", "Reed", "Bailey", "Bell", "Kelly", "Howard",
    "Ward", "Richardson", "Watson", "Brooks", "Bennett", "Gray", "Hughes", "Price", "Sanders", "Myers",
    "Ross", "Foster", "Powell", "Jenkins", "Perry", "Russell", "Sullivan", "Fisher", "Murray", "Gordon",
    "Walsh", "Byrne", "Ryan", "Kennedy", "Doyle", "Lynch", "Quinn", "Gallagher", "Fitzgerald", "Fraser",
    "Sinclair", "Munro", "Douglas", "Davies", "Llewellyn", "Pryce", "Vaughan", "Kahale", "Kealoha", "Ngata",
    "Parata", "Tuilagi", "Faleolo", "Tanui", "Lopez", "Alonso", "Cabrera", "Campos", "Nunez", "Soto",
    "Rios", "Fuentes",
)

CITIES = (
    "Lisbon", "Porto", "Madrid", "Barcelona", "Seville", "Valencia", "Bilbao", "Paris", "Lyon", "Marseille",
    "Bordeaux", "Toulouse", "Lille", "Strasbourg", "Brussels", "Antwerp", "Ghent", "Amsterdam", "Rotterdam", "Utrecht",
    "Berlin", "Hamburg", "Munich", "Cologne", "Frankfurt", "Leipzig", "Dresden", "Stuttgart", "Vienna", "Salzburg",
    "Graz", "Zurich", "Geneva", "Basel", "Bern", "Milan", "Rome", "Naples", "Turin", "Florence",
    "Venice", "Bologna", "Genoa", "Palermo", "Athens", "Thessaloniki", "Istanbul", "Ankara", "Izmir", "Bucharest",
    "Belgrade", "Zagreb", "Ljubljana", "Sarajevo", "Budapest", "Prague", "Brno", "Bratislava", "Krakow", "Warsaw",
    "Gdansk", "Wroclaw", "Vilnius", "Riga", "Tallinn", "Helsinki", "Stockholm", "Gothenburg", "Oslo", "Bergen",
    "Copenhagen", "Aarhus", "Reykjavik", "Dublin", "Galway", "Belfast", "Edinburgh", "Glasgow", "Aberdeen", "London",
    "Manchester", "Liverpool", "Leeds", "Bristol", "Cardiff", "Newcastle", "Birmingham", "Oxford", "Cambridge", "Brighton",
    "Kyiv", "Lviv", "Odesa", "Tbilisi", "Yerevan", "Baku", "Almaty", "Tashkent", "Samarkand", "Cairo",
    "Alexandria", "Casablanca", "Marrakesh", "Fez", "Tunis", "Algiers", "Dakar", "Accra", "Lagos", "Abuja",
    "Kumasi", "Nairobi", "Mombasa", "Kampala", "Kigali", "Zanzibar", "Addis Ababa", "Khartoum", "Luanda", "Kinshasa",
    "Lusaka", "Harare", "Windhoek", "Gaborone", "Maputo", "Johannesburg", "Durban", "Cape Town", "Pretoria", "Antananarivo",
    "Dubai", "Abu Dhabi", "Doha", "Muscat", "Riyadh", "Jeddah", "Amman", "Beirut", "Jerusalem", "Tel Aviv",
    "Haifa", "Tehran", "Isfahan", "Shiraz", "Karachi", "Lahore", "Islamabad", "Delhi", "Mumbai", "Bangalore",
    "Chennai", "Kolkata", "Hyderabad", "Pune", "Jaipur", "Kochi", "Kathmandu", "Dhaka", "Colombo", "Thimphu",
    "Yangon", "Bangkok", "Chiang Mai", "Phuket", "Hanoi", "Da Nang", "Phnom Penh", "Vientiane", "Kuala Lumpur", "Penang",
    "Singapore", "Jakarta", "Bandung", "Yogyakarta", "Denpasar", "Manila", "Cebu", "Davao", "Hong Kong", "Macau",
    "Taipei", "Kaohsiung", "Shanghai", "Beijing", "Shenzhen", "Guangzhou", "Chengdu", "Hangzhou", "Xian", "Wuhan",
    "Nanjing", "Kunming", "Harbin", "Seoul", "Busan", "Incheon", "Tokyo", "Osaka", "Kyoto", "Sapporo",
    "Fukuoka", "Nagoya", "Hiroshima", "Sendai", "Ulaanbaatar", "Sydney", "Melbourne", "Brisbane", "Perth", "Adelaide",
    "Hobart", "Darwin", "Canberra", "Auckland", "Wellington", "Christchurch", "Queenstown", "Suva", "Apia", "Honolulu",
    "Anchorage", "Vancouver", "Calgary", "Edmonton", "Winnipeg", "Toronto", "Ottawa", "Montreal", "Quebec City", "Halifax",
    "Seattle", "Portland", "San Francisco", "Oakland", "Los Angeles", "San Diego", "Las Vegas", "Phoenix", "Denver", "Austin",
    "Dallas", "Houston", "San Antonio", "Chicago", "Detroit", "Minneapolis", "Milwaukee", "Boston", "New York", "Philadelphia",
    "Pittsburgh", "Baltimore", "Atlanta", "Miami", "Orlando", "Nashville", "Memphis", "New Orleans", "Savannah", "Mexico City",
    "Guadalajara", "Monterrey", "Oaxaca", "Merida", "Puebla", "Havana", "Kingston", "San Juan", "Santo Domingo", "Panama City",
    "San Jose", "Guatemala City", "Bogota", "Medellin", "Cartagena", "Cali", "Quito", "Guayaquil", "Lima", "Cusco",
    "Arequipa", "La Paz", "Santiago", "Valparaiso", "Buenos Aires", "Cordoba", "Mendoza", "Rosario", "Montevideo", "Asuncion",
    "Sao Paulo", "Salvador", "Recife", "Fortaleza", "Brasilia", "Curitiba", "Manaus", "Belo Horizonte", "Porto Alegre", "Florianopolis",
    "Caracas", "Nuuk", "Tromso", "Valletta", "Nicosia", "Tirana", "Skopje", "Podgorica", "Chisinau", "Minsk",
    "Dubrovnik", "Luxembourg", "Monaco",
)

VENUES = (
    "Harbour Hall", "Riverside Pavilion", "Old Mill Studio", "Granite Loft", "Lantern House",
    "Copper Kettle Room", "Cedar Hall", "Maple Room", "Willow Pavilion", "Foundry Hall",
    "Glasshouse Gallery", "Orchard Barn", "Lighthouse Loft", "Quayside Rooms", "Canal Warehouse",
    "Beacon Hall", "Summit Lounge", "Garden Court", "Ivory Ballroom", "Oak Gallery",
    "Stone Chapel", "Brick Yard", "Ironworks Hall", "Tidewater Room", "Meadow Pavilion",
    "Northlight Studio", "Silverbirch Hall", "Atrium Forum", "Corner Theatre", "Depot Hall",
    "Signal Box Studio", "Printworks Hall", "Tannery Loft", "Boathouse Terrace", "Library Hall",
    "Clocktower Room", "Market Hall", "Observatory Deck", "Pier Pavilion", "Rooftop Terrace",
    "Courtyard Studio", "Arcade Hall", "Vault Room", "Cellar Bar", "Linen Hall",
    "Granary Loft", "Tram Shed", "Engine Room", "Docklands Hub", "Parkside Hall",
    "Hillside Lodge", "Lakeside Pavilion", "Bayview Room", "Sunset Terrace", "Cobalt Hall",
    "Amber Room", "Fern House", "Heron Hall", "Kingfisher Room", "Wharf Studio",
    "Brewery Yard", "Armoury Hall", "Assembly Rooms", "Exchange Hall", "Guild Hall",
    "Merchant House", "Chapel Loft", "Forge Studio", "Weaver Hall", "Saltworks Gallery",
    "Ropewalk Hall", "Cotton Exchange", "Mill Race Room", "Old Post Office", "Old Fire Station",
    "Old Bank Vault", "Old Customs House", "Grand Pavilion", "Little Theatre", "Upper Gallery",
    "Long Room", "Great Hall", "Blue Door Studio", "Red Brick Hall", "Green Room Studio",
    "White Box Gallery", "Black Box Theatre", "Glass Pavilion", "Timber Hall", "Slate Room",
    "Marble Hall", "Velvet Lounge", "Skylight Studio", "Crescent Hall", "Terrace Room",
    "Palm House", "Winter Garden", "Bandstand Pavilion", "Seaview Ballroom", "Cliffside Lodge",
    "Pine Lodge", "Birchwood Barn", "Foxglove Room", "Starlight Hall",
)

ORG_PREFIXES = (
    "Bluefin", "Northwind", "Brightline", "Ironwood", "Silverleaf", "Redstone", "Clearwater", "Greenfield",
    "Highland", "Blackbird", "Goldcrest", "Stonebridge", "Westbrook", "Eastgate", "Southpoint", "Keystone",
    "Lighthouse", "Bluepeak", "Sunrise", "Evergreen", "Oakridge", "Pinecrest", "Riverbend", "Fairwind",
    "Quantum", "Vertex", "Pinnacle", "Horizon", "Meridian", "Cascade", "Summit", "Beacon",
    "Harbor", "Crestview", "Driftwood", "Foxhollow", "Greystone", "Hawthorn", "Larkspur", "Moonstone",
    "Northstar", "Oakleaf", "Parallel", "Saltmarsh", "Tallgrass", "Upland", "Vantage", "Wildflower",
    "Yellowtail", "Amberline", "Brightwater", "Coppergate", "Deepwell", "Everlight", "Glenmore", "Hollowbrook",
    "Inkwell", "Silverline", "Bridgewater", "Fernbrook", "Copperleaf", "Mosswood", "Thornfield", "Windmere",
)

ORG_SUFFIXES = (
    "Labs", "Group", "Partners", "Collective", "Works", "Studio", "Foundation", "Systems",
    "Analytics", "Ventures", "Holdings", "Consulting", "Solutions", "Dynamics", "Logistics", "Media",
    "Health", "Robotics", "Energy", "Capital", "Networks", "Software", "Design", "Institute",
    "Trust", "Cooperative", "Agency", "Industries",
)

PROJECT_CODENAMES = (
    "Juniper", "Aurora", "Basalt", "Obsidian", "Granite", "Cobalt", "Quartz", "Onyx", "Jasper", "Garnet",
    "Topaz", "Sapphire", "Emerald", "Zircon", "Feldspar", "Mica", "Shale", "Flint", "Marble", "Cedar",
    "Sequoia", "Redwood", "Cypress", "Hemlock", "Spruce", "Larch", "Alder", "Birch", "Aspen", "Willow",
    "Magnolia", "Lotus", "Orchid", "Saffron", "Cinnamon", "Nutmeg", "Paprika", "Fennel", "Thistle", "Bramble",
    "Clover", "Sorrel", "Tamarind", "Falcon", "Osprey", "Condor", "Heron", "Kestrel", "Harrier", "Albatross",
    "Pelican", "Puffin", "Cormorant", "Egret", "Raven", "Magpie", "Wren", "Starling", "Lynx", "Otter",
    "Badger", "Marten", "Ibex", "Bison", "Narwhal", "Orca", "Manta", "Marlin", "Barracuda", "Stingray",
    "Nautilus", "Triton", "Nebula", "Quasar", "Pulsar", "Comet", "Meteor", "Eclipse", "Solstice", "Equinox",
    "Zenith", "Nadir", "Vortex", "Cyclone", "Monsoon", "Tempest", "Zephyr", "Mistral", "Sirocco", "Typhoon",
    "Glacier", "Tundra", "Fjord", "Delta", "Mesa", "Canyon", "Atlas", "Titan", "Helios", "Orion",
    "Lyra", "Draco", "Cygnus", "Pegasus", "Andromeda", "Cassini", "Kepler", "Galileo", "Hubble", "Voyager",
    "Pioneer", "Mariner", "Odyssey", "Paragon", "Lodestar", "Anvil", "Bastion", "Citadel", "Rampart", "Trellis",
    "Lattice", "Prism", "Spectrum", "Lantern", "Compass", "Sextant", "Astrolabe", "Quill", "Parchment", "Ember",
    "Cinder", "Blaze", "Sparrow", "Hummingbird", "Mongoose", "Wombat", "Koala", "Platypus", "Gecko", "Iguana",
    "Chameleon", "Axolotl", "Tortoise", "Firefly", "Dragonfly", "Mantis", "Cicada", "Hornet",
)

LANDMARKS = (
    "the old cathedral", "the harbour market", "the botanical garden", "the modern art museum",
    "the hilltop fortress", "the central station", "the old town square", "the riverside promenade",
    "the flower market", "the fish market", "the covered market", "the night market",
    "the spice bazaar", "the old lighthouse", "the city aquarium", "the science museum",
    "the natural history museum", "the maritime museum", "the railway museum", "the folk museum",
    "the history museum", "the photography gallery", "the sculpture park", "the rose garden",
    "the japanese garden", "the palm house", "the city zoo", "the royal palace",
    "the summer palace", "the old palace gardens", "the castle ruins", "the medieval walls",
    "the city gate", "the clock tower", "the bell tower", "the observation deck",
    "the tv tower", "the cable car", "the funicular", "the harbour cruise",
    "the river cruise", "the old bridge", "the suspension bridge", "the stone bridge",
    "the city park", "the lakeside park", "the waterfront boardwalk", "the sandy beach",
    "the rocky cove", "the sea cliffs", "the coastal trail", "the forest trail",
    "the waterfall hike", "the crater lake", "the hot springs", "the thermal baths",
    "the old monastery", "the hillside temple", "the golden pagoda", "the grand mosque",
    "the old synagogue", "the blue chapel", "the basilica", "the abbey ruins",
    "the catacombs", "the roman amphitheatre", "the ancient forum", "the old aqueduct",
    "the archaeological site", "the city library", "the opera house", "the concert hall",
    "the old theatre", "the jazz club", "the street art district", "the artists quarter",
    "the old port", "the marina", "the shipyard tour", "the lighthouse point",
    "the fishing village", "the vineyard tour", "the olive grove", "the tea plantation",
    "the coffee farm", "the chocolate factory", "the brewery tour", "the distillery",
    "the cheese shop", "the bakery district", "the food hall", "the street food alley",
    "the antique market", "the flea market", "the bookshop quarter", "the university campus",
    "the old observatory", "the planetarium", "the sunset viewpoint", "the panoramic terrace",
    "the hilltop chapel", "the mountain hut", "the glacier viewpoint", "the river delta",
    "the wetland reserve", "the bird sanctuary", "the butterfly house", "the arboretum",
    "the bamboo forest", "the salt flats", "the sand dunes", "the limestone caves",
    "the canyon rim", "the city cemetery", "the war memorial", "the independence monument",
    "the parliament building", "the city hall", "the old customs house", "the stock exchange",
    "the merchant houses", "the textile museum", "the design museum", "the toy museum",
    "the car museum", "the aviation museum", "the space centre", "the ceramics workshop",
    "the glassblowing studio", "the craft market", "the farmers market", "the harbour fortress",
    "the island ferry", "the canal tour", "the gondola ride", "the old quarter",
    "the latin quarter", "the lantern festival grounds", "the public gardens", "the water gardens",
    "the statue garden", "the royal gardens", "the riverside cafe", "the rooftop bar",
    "the old brewery", "the windmill", "the water mill", "the salt mine",
    "the silver mine", "the fortress museum", "the castle keep", "the palace museum",
    "the city museum", "the contemporary art centre", "the open air museum", "the botanical conservatory",
    "the cliff walk", "the lagoon", "the coral reef", "the mangrove boardwalk",
    "the volcano crater", "the lava fields", "the rice terraces", "the tea house",
    "the zen garden", "the shrine gate", "the pilgrimage steps", "the old railway line",
    "the steam train", "the tram museum", "the seaside pier", "the amusement park",
    "the sports stadium", "the velodrome", "the ice rink",
)

AGENDA_ITEMS = (
    "opening keynote", "closing keynote", "poster session", "budget review", "team lunch",
    "welcome coffee", "morning registration", "panel discussion", "fireside chat", "lightning talks",
    "breakout workshops", "hands-on lab", "product demo", "customer showcase", "networking reception",
    "coffee break", "afternoon tea", "roadmap briefing", "quarterly results", "hiring update",
    "security briefing", "office hours", "hackathon kickoff", "hackathon judging", "awards ceremony",
    "group photo", "speed networking", "mentoring circle", "career fair", "sponsor booths",
    "live podcast recording", "book signing", "audience questions", "investor pitch", "design critique",
    "code walkthrough", "team retrospective", "sprint planning", "strategy session", "brainstorming session",
    "user research readout", "partner update", "sales kickoff", "training module", "compliance training",
    "wellness walk", "guided meditation", "gala dinner", "cocktail hour", "city walking tour",
    "closing remarks", "welcome remarks", "icebreaker games", "round table", "expert panel",
    "case study presentation", "vendor demos", "unconference session", "birds of a feather session", "demo day",
    "community awards", "open mic", "student showcase", "research talks", "invited talk",
    "tutorial session", "paper presentations", "doctoral consortium", "industry track", "ethics panel",
    "diversity roundtable", "volunteer briefing", "press conference", "media interviews", "photo booth",
    "trivia night", "karaoke night", "farewell breakfast", "board meeting", "annual general meeting",
    "all hands meeting", "town hall", "open house", "lab tour", "site visit",
    "charity auction", "dessert reception", "recruiting mixer", "alumni meetup",
)

MILESTONES = (
    "design review", "beta release", "load testing", "requirements freeze", "prototype demo",
    "alpha release", "code freeze", "security audit", "user acceptance testing", "go live",
    "feature complete", "data migration", "api freeze", "integration testing", "performance tuning",
    "accessibility audit", "localisation pass", "documentation sprint", "pilot rollout", "vendor selection",
    "contract signing", "kickoff meeting", "architecture sign-off", "staging deployment", "production cutover",
    "penetration test", "release candidate", "general availability", "post-launch review", "stakeholder sign-off",
    "budget approval", "core team hiring", "infrastructure setup", "schema freeze", "ui mockups",
    "usability study", "market research", "competitor analysis", "pricing decision", "soft launch",
    "public announcement", "press release", "customer onboarding", "training rollout", "support handover",
    "disaster recovery drill", "compliance review", "legal review", "privacy assessment", "capacity planning",
    "cost review", "tech debt cleanup", "mobile app submission", "app store review", "analytics setup",
    "feedback survey", "final retrospective", "project handoff", "dependency upgrade", "model evaluation",
    "dataset collection", "annotation pass", "hardware procurement", "field trial", "certification audit",
)

EXERCISES = (
    "plank", "hill sprints", "yoga flow", "rowing intervals", "push-ups",
    "squats", "lunges", "burpees", "jumping jacks", "mountain climbers",
    "deadlifts", "bench press", "pull-ups", "kettlebell swings", "box jumps",
    "jump rope", "cycling intervals", "easy jog", "tempo run", "long run",
    "stair climbs", "wall sits", "side planks", "glute bridges", "bicycle crunches",
    "russian twists", "leg raises", "bird dogs", "dead bugs", "calf raises",
    "hamstring stretch", "hip openers", "foam rolling", "sun salutations", "pilates core work",
    "swimming laps", "brisk walk", "battle ropes", "farmer carries", "goblet squats",
    "step-ups", "shoulder presses", "bicep curls", "tricep dips", "lat pulldowns",
    "seated rows", "medicine ball slams", "shadow boxing", "tai chi", "breathing drills",
    "balance drills", "agility ladder", "sled pushes", "cooldown stretches", "resistance band rows",
)

SHOPPING_ITEMS = (
    "a standing desk", "noise cancelling headphones", "a rice cooker", "a coffee grinder", "an espresso machine",
    "a cast iron skillet", "a chef knife", "a cutting board", "a blender", "a stand mixer",
    "an air fryer", "a slow cooker", "a water filter", "a reusable water bottle", "a yoga mat",
    "a foam roller", "running shoes", "hiking boots", "a rain jacket", "a winter coat",
    "wool socks", "a backpack", "a carry-on suitcase", "a travel pillow", "a portable charger",
    "a mechanical keyboard", "a wireless mouse", "a monitor arm", "an ergonomic chair", "a desk lamp",
    "a webcam", "a microphone", "a tablet stand", "an e-reader", "a smart speaker",
    "a robot vacuum", "a dehumidifier", "an air purifier", "a space heater", "a desk fan",
    "blackout curtains", "a memory foam pillow", "a duvet cover", "bath towels", "a shower caddy",
    "an electric toothbrush", "a hair dryer", "a weekly planner", "fountain pens", "a sketchbook",
    "watercolour paints", "a guitar tuner", "a ukulele", "a bike helmet", "a bike lock",
    "a camping tent", "a sleeping bag", "a camping stove", "a headlamp", "binoculars",
    "a picnic blanket", "a cooler bag", "a garden hose", "potting soil", "a watering can",
    "a bird feeder", "a dog leash", "a cat scratching post", "a fish tank", "a board game",
    "a jigsaw puzzle", "a cookbook", "a french press", "a kettle", "a toaster",
    "a dish rack", "storage boxes", "a shoe rack", "a coat stand", "a bookshelf",
    "a houseplant", "a wall clock", "a doormat", "a label maker", "a laptop sleeve",
    "a phone case", "a smartwatch", "wireless earbuds",
)

SMALLTALK = (
    "The weather has been so grey this week.",
    "Any tips for falling asleep faster?",
    "I finally finished that puzzle book.",
    "My neighbour started learning the trumpet again.",
    "Do you think it is worth getting a houseplant?",
    "The coffee at work tasted burnt today.",
    "It rained the moment the laundry went out.",
    "My cat knocked a glass off the table this morning.",
    "What is a good snack for a long afternoon?",
    "The bus was late again today.",
    "I tried a new soup recipe last night.",
    "Is it normal to feel sleepy after lunch?",
    "The birds outside have been very loud lately.",
    "My phone battery drains so fast these days.",
    "I keep forgetting to water the plants.",
    "Do you have a favourite kind of tea?",
    "The park was packed over the weekend.",
    "I watched a documentary about octopuses yesterday.",
    "What is a fun hobby to pick up in winter?",
    "The traffic this morning was unbelievable.",
    "I think spring is finally on its way.",
    "My socks never seem to come back from the laundry in pairs.",
    "How do people stay motivated on rainy days?",
    "I burnt the toast again.",
    "The new cafe down the street has great pastries.",
    "Do you prefer mornings or evenings?",
    "The sunset tonight was really pretty.",
    "I spent way too long scrolling before bed.",
    "My headphones keep tangling in my bag.",
    "It has been ages since a proper day off.",
    "The office plant is somehow still alive.",
    "I could really use a nap right now.",
    "What is the best way to keep bread fresh?",
    "The neighbours had a barbecue that smelled amazing.",
    "I keep humming the same song all day.",
    "Is it weird to eat cereal for dinner?",
    "The kettle at work finally broke.",
    "My umbrella flipped inside out on the way home.",
    "Do you think a short walk helps with focus?",
    "The days are getting noticeably longer.",
    "I found an old photo album while tidying up.",
    "The pizza place nearby changed its menu.",
    "What is a good podcast for a long drive?",
    "I tried to bake bread but it came out flat.",
    "My houseplants are growing faster than expected.",
    "Any recommendations for a cosy blanket?",
    "The wind was wild last night.",
    "I need a better playlist for cleaning.",
    "Honestly this week has felt very long.",
    "The crossword today was surprisingly tricky.",
    "My dog refuses to walk in the rain.",
    "What is your take on pineapple on pizza?",
    "The ice cream van came by early today.",
    "I always lose track of time on weekends.",
    "There was a double rainbow this afternoon.",
    "My coffee went cold before the first sip.",
    "Is it too early to think about holiday plans?",
    "The library had a great book sale today.",
    "I finally fixed the squeaky door.",
    "Some days just need an extra cup of tea.",
    "The fog this morning made everything look spooky.",
    "Do you ever get songs stuck in your head?",
    "I reorganised my wardrobe over the weekend.",
    "The grocery store was out of my favourite cereal.",
    "How do you stop a kettle from getting limescale?",
    "My knees are sore from gardening.",
    "That thunderstorm last night was intense.",
    "Any advice for keeping a sourdough starter alive?",
    "I might start journaling again.",
)


_CAP_WORD = r"[A-Z][a-z]+"
_LOWER_PHRASE = re.compile(r"^[a-z]+(?:[ -][a-z]+)*$")


def _cap_pattern(min_words, max_words):
    rest = "(?: %s){%d,%d}" % (_CAP_WORD, min_words - 1, max_words - 1)
    return re.compile("^%s%s$" % (_CAP_WORD, rest))


def _require(cond, name, msg):
    if not cond:
        raise AssertionError("%s: %s" % (name, msg))


def _basic(name, values, min_size):
    _require(isinstance(values, tuple), name, "must be a tuple")
    _require(len(values) >= min_size, name, "has %d entries, need >= %d" % (len(values), min_size))
    seen = set()
    for v in values:
        _require(isinstance(v, str) and v, name, "non-string or empty entry %r" % (v,))
        _require(v.isascii(), name, "non-ASCII entry %r" % v)
        _require(not any(c.isdigit() for c in v), name, "digit in %r" % v)
        _require("'" not in v and '"' not in v, name, "apostrophe or quote in %r" % v)
        _require(v == v.strip() and "  " not in v, name, "bad whitespace in %r" % v)
        _require(v not in seen, name, "duplicate entry %r" % v)
        seen.add(v)


def _capitalised(name, values, min_words, max_words):
    pat = _cap_pattern(min_words, max_words)
    for v in values:
        _require(pat.match(v) is not None, name,
                 "%r must be %d-%d capitalised words" % (v, min_words, max_words))


def _lower_items(name, values):
    for v in values:
        _require(_LOWER_PHRASE.match(v) is not None, name, "%r must be a lowercase phrase" % v)
        for bad in (",", " then ", " and "):
            _require(bad not in v, name, "forbidden substring %r in %r" % (bad, v))


def _disjoint(name_a, a, name_b, b):
    common = sorted(set(a) & set(b))
    _require(not common, "%s/%s" % (name_a, name_b), "overlap %r" % common[:10])


def check():
    _basic("FIRST_NAMES", FIRST_NAMES, 300)
    _basic("LAST_NAMES", LAST_NAMES, 300)
    _basic("CITIES", CITIES, 200)
    _basic("VENUES", VENUES, 80)
    _basic("ORG_PREFIXES", ORG_PREFIXES, 60)
    _basic("ORG_SUFFIXES", ORG_SUFFIXES, 20)
    _basic("PROJECT_CODENAMES", PROJECT_CODENAMES, 120)
    _basic("LANDMARKS", LANDMARKS, 150)
    _basic("AGENDA_ITEMS", AGENDA_ITEMS, 80)
    _basic("MILESTONES", MILESTONES, 60)
    _basic("EXERCISES", EXERCISES, 50)
    _basic("SHOPPING_ITEMS", SHOPPING_ITEMS, 80)
    _basic("SMALLTALK", SMALLTALK, 60)

    _capitalised("FIRST_NAMES", FIRST_NAMES, 1, 1)
    _capitalised("LAST_NAMES", LAST_NAMES, 1, 1)
    _capitalised("CITIES", CITIES, 1, 2)
    _capitalised("VENUES", VENUES, 2, 3)
    _capitalised("ORG_PREFIXES", ORG_PREFIXES, 1, 1)
    _capitalised("ORG_SUFFIXES", ORG_SUFFIXES, 1, 1)
    _capitalised("PROJECT_CODENAMES", PROJECT_CODENAMES, 1, 1)

    for name, values in (("CITIES", CITIES), ("VENUES", VENUES)):
        for v in values:
            _require("," not in v, name, "comma in %r" % v)

    _disjoint("FIRST_NAMES", FIRST_NAMES, "LAST_NAMES", LAST_NAMES)
    _disjoint("FIRST_NAMES", FIRST_NAMES, "CITIES", CITIES)
    _disjoint("LAST_NAMES", LAST_NAMES, "CITIES", CITIES)
    _disjoint("PROJECT_CODENAMES", PROJECT_CODENAMES, "FIRST_NAMES", FIRST_NAMES)
    _disjoint("PROJECT_CODENAMES", PROJECT_CODENAMES, "CITIES", CITIES)
    _disjoint("PROJECT_CODENAMES", PROJECT_CODENAMES, "LAST_NAMES", LAST_NAMES)
    _disjoint("PROJECT_CODENAMES", PROJECT_CODENAMES, "ORG_PREFIXES", ORG_PREFIXES)
    _disjoint("ORG_PREFIXES", ORG_PREFIXES, "ORG_SUFFIXES", ORG_SUFFIXES)

    # Venue names must not contain a city name as a whole word sequence.
    for v in VENUES:
        padded = " %s " % v
        for city in CITIES:
            _require(" %s " % city not in padded, "VENUES", "%r contains city %r" % (v, city))

    for name, values in (("AGENDA_ITEMS", AGENDA_ITEMS), ("MILESTONES", MILESTONES),
                         ("EXERCISES", EXERCISES), ("SHOPPING_ITEMS", SHOPPING_ITEMS),
                         ("LANDMARKS", LANDMARKS)):
        _lower_items(name, values)
    for v in LANDMARKS:
        _require(v.startswith("the "), "LANDMARKS", "%r must start with 'the '" % v)

    for v in SMALLTALK:
        _require(v[0].isupper(), "SMALLTALK", "%r must start with a capital letter" % v)
        _require(not any(c.isupper() for c in v[1:]), "SMALLTALK",
                 "%r has a capitalised word after the first letter" % v)
        _require(v[-1] in ".?!", "SMALLTALK", "%r must end with punctuation" % v)
        _require(re.match(r"^[A-Za-z ,.?!-]+$", v) is not None, "SMALLTALK", "odd characters in %r" % v)


if __name__ == "__main__":
    check()
    print("ok")
